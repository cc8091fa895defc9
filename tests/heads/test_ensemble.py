"""Head ensembles (heads.artefacts.head.EnsembleHead): one head whose L1 energy is the mean of its members' energies, saved,
loaded, evaluated and exported like any head; a grid's `#ensemble=K` is its K best configurations."""
import json

import numpy as np
import polars as pl
import pytest
import torch
from click.testing import CliRunner

import headstore
from headstore.cli import main
from headstore.heads.artefacts.head import EnsembleHead
from headstore.heads.settings.config import HeadConfig

MEMBERS = [HeadConfig(hidden=16), HeadConfig(hidden=16, depth=2), HeadConfig(hidden=16)]


def _members(world, shapes=MEMBERS, normalize="l2"):
    return [headstore.Head.load(world.random_head(f"member-{i}-{normalize}", cfg, normalize, seed=i))
            for i, cfg in enumerate(shapes)]


def test_ensemble_energy_is_the_mean_of_its_members_and_round_trips(world, tmp_path):
    members = _members(world)
    ens = EnsembleHead(members, source="test")
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(7, ens.in_dim, generator=gen), torch.randn(5, ens.in_dim, generator=gen)
    want = np.mean([m.energy(a, b) for m in members], axis=0)  # (7, 5) mean of the members' L1 energies
    np.testing.assert_allclose(ens.energy(a, b), want, rtol=1e-5, atol=1e-5)
    assert ens.embed(a).shape == (7, sum(m.out_dim for m in members))
    loaded = headstore.Head.load(ens.save(tmp_path / "ens"))
    assert isinstance(loaded, EnsembleHead) and len(loaded.members) == 3
    np.testing.assert_array_equal(loaded.energy(a, b), ens.energy(a, b))
    r = CliRunner().invoke(main, ["eval", "--store", str(world.store), "--head", str(tmp_path / "ens"), "--data",
                                  str(world.beir), "--out", str(tmp_path / "eval")])
    assert r.exit_code == 0, r.output


def test_ensemble_exports_to_sentence_transformers_exactly(world, tmp_path):
    from sentence_transformers import SentenceTransformer

    ens = EnsembleHead(_members(world, [HeadConfig(hidden=16), HeadConfig(hidden=12), HeadConfig(hidden=16)]))
    ens.save(tmp_path / "ens")
    out = tmp_path / "st"
    r = CliRunner().invoke(main, ["export", "--head", str(tmp_path / "ens"), "--format", "sentence-transformers",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    model = SentenceTransformer(str(out), device="cpu")
    texts = headstore.Store.open(world.store).texts["text"].to_list()[:30]
    got = model.encode(texts, convert_to_numpy=True)
    pipe = headstore.Pipeline.from_head(headstore.Head.load(tmp_path / "ens"))
    np.testing.assert_allclose(got, pipe.encode(texts), rtol=0, atol=1e-5)
    np.testing.assert_allclose(-model.similarity(got[:4], got).numpy(), pipe.score(texts[:4], texts), rtol=1e-4, atol=1e-4)


def test_ensembles_that_cannot_be_one_head_are_refused(world, tmp_path):
    l2_member = headstore.Head.load(world.random_head("member-l2-energy", HeadConfig(hidden=16), energy="l2"))
    with pytest.raises(ValueError, match="L1 energies"):
        EnsembleHead([_members(world)[0], l2_member])
    mixed = EnsembleHead([_members(world)[0], _members(world, [HeadConfig(hidden=16)], "center")[0]])
    mixed.save(tmp_path / "mixed")
    r = CliRunner().invoke(main, ["export", "--head", str(tmp_path / "mixed"), "--format", "sentence-transformers",
                                  "--out", str(tmp_path / "st")])
    assert r.exit_code == 2 and "different feature normalisers" in r.output


@pytest.fixture(scope="module")
def l1_grid(world, tmp_path_factory):
    spec = tmp_path_factory.mktemp("ens-grid") / "grid.toml"
    spec.write_text('[grid]\nlr = [1e-3, 3e-3, 1e-2]\nseed = [0, 1]\n[fixed]\nepochs = 1\nbatch_size = 8\nhidden = 16\n'
                    'mined_k = 2\n')
    out = spec.parent / "out"
    r = CliRunner().invoke(main, ["grid", "--store", str(world.store), "--data", str(world.beir), "--grid", str(spec),
                                  "--out", str(out), "--ensemble", "2", "--ensemble", "1"])
    assert r.exit_code == 0, r.output
    return out


def test_grid_scores_ensembles_per_seed(world, l1_grid):
    from headstore.featurize.store.reader import FeatureStore
    from headstore.heads.evaluation.evaluate import embedder, evaluate_split
    from headstore.heads.network.features import load_features
    from headstore.heads.kinds import load_task

    info = json.loads((l1_grid / "ensembles.json").read_text())
    assert [r["k"] for r in info["rows"]] == [1, 2] and all(r["seeds"] == 2 for r in info["rows"])
    results = pl.read_parquet(l1_grid / "results.parquet")
    store = FeatureStore.open(world.store)
    task, X = load_task(str(world.beir), store), load_features(store)
    for rec in info["per_seed"]:
        members = [headstore.Head.load(f"{l1_grid}#id={h}") for h in rec["head_ids"]]
        assert {results.filter(pl.col("head_id") == h)["seed"][0] for h in rec["head_ids"]} == {rec["seed"]}
        ens = EnsembleHead(members)
        res, _ = evaluate_split(task, "test", embedder(ens.model, X), ("l1",))
        assert res[0]["manhattan_ndcg@10"] == pytest.approx(rec["test_primary"])
        if rec["k"] == 1:  # an ensemble of one is that head
            row = results.filter(pl.col("head_id") == rec["head_ids"][0])
            assert rec["dev_primary"] == pytest.approx(row["dev_primary"][0], abs=1e-6)
    assert "## Ensembles" in (l1_grid / "leaderboard.md").read_text()


def test_grid_ensemble_is_its_best_configurations(world, l1_grid, tmp_path):
    ens = headstore.Head.load(f"{l1_grid}#ensemble=2")
    ranks = [headstore.Head.load(f"{l1_grid}#rank={k}") for k in (1, 2)]
    assert [m.config["grid"]["head_id"] for m in ens.members] == [h.config["grid"]["head_id"] for h in ranks]
    x = torch.randn(4, ens.in_dim)
    np.testing.assert_allclose(ens.energy(x, x[:2]), (ranks[0].energy(x, x[:2]) + ranks[1].energy(x, x[:2])) / 2,
                               rtol=1e-5, atol=1e-6)
    r = CliRunner().invoke(main, ["export", "--grid", str(l1_grid), "--ensemble", "2", "--format", "safetensors",
                                  "--out", str(tmp_path / "e")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "e" / "ensemble.json").read_text())["config"]["ensemble"]["k"] == 2
    with pytest.raises(ValueError, match="out of range"):
        headstore.Head.load(f"{l1_grid}#ensemble=9")


def test_ensemble_groups_skip_cosine_heads_and_other_arrays():
    from headstore.heads.artefacts.files import ensemble_groups

    rows = [{"head_id": f"h{i}", "status": "ok", "loss": loss, "energy": "l1", "array": array, "lr": lr, "seed": 0,
             "dev_primary": dev}
            for i, (loss, array, lr, dev) in enumerate([("mnr", "features", 1e-3, 0.9), ("l1-energy", "features", 1e-3, 0.8),
                                                        ("l1-energy", "features+features_layer-4", 1e-3, 0.7),
                                                        ("l1-energy", "features", 3e-3, 0.6)])]
    groups = ensemble_groups(pl.DataFrame(rows))
    assert [g["head_id"][0] for g in groups] == ["h1", "h3"]


def test_a_loss_that_ignores_the_energy_is_souped_and_ensembled_under_cosine(world, tmp_path, monkeypatch):
    """One energy rule (issue 32 item 7): heads of a loss that ignores the energy setting (not mnr: a registry
    entry made here, and supcon) are trained, souped and ensembled under cosine, whatever `energy` says."""
    from headstore.heads.artefacts.files import ensemble_groups
    from headstore.heads.settings.config import TrainConfig
    from headstore.heads.scoring.losses import LOSSES, LossSpec, scoring_energy

    monkeypatch.setitem(LOSSES, "mnr-twin", LossSpec("mnr-twin", ("positives",), negatives=True, uses_energy=False,
                                                     pairs_fn="pairs:mnr_loss"))
    for loss in ("mnr-twin", "supcon"):
        assert TrainConfig(loss=loss, energy="l1").eval_energy == scoring_energy(loss, "l1") == "cosine"
    spec = tmp_path / "grid.toml"
    spec.write_text('[grid]\nlr = [1e-3, 1e-2]\n[fixed]\nloss = "mnr-twin"\nenergy = "l1"\nepochs = 2\n'
                    'batch_size = 8\nhidden = 16\nmined_k = 2\n')
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["grid", "--store", str(world.store), "--data", str(world.beir), "--grid", str(spec),
                                  "--out", str(out), "--soup", "1", "--ensemble", "1"])
    assert r.exit_code == 0, r.output
    results = pl.read_parquet(out / "results.parquet")
    assert ensemble_groups(results) == []  # no l1 heads: nothing to ensemble under the mean L1 energy
    soup = json.loads((out / "soups.json").read_text())["per_seed"][0]  # the soup of one: the best head
    best = results.filter(pl.col("head_id") == soup["head_ids"][0])
    assert soup["dev_primary"] == pytest.approx(best["dev_primary"][0], abs=1e-6)  # scored as it was trained
    frame = pl.DataFrame([{"head_id": "s", "status": "ok", "loss": "supcon", "energy": "l1", "array": "features",
                           "lr": 1e-3, "seed": 0, "dev_primary": 0.9},
                          {"head_id": "e", "status": "ok", "loss": "l1-energy", "energy": "l1", "array": "features",
                           "lr": 1e-3, "seed": 0, "dev_primary": 0.8}])
    assert [g["head_id"][0] for g in ensemble_groups(frame)] == ["e"]  # supcon is cosine, not l1
