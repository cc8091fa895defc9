"""The levers of issue 20: strength after training (heads.training.strength), the anchor on the unlabeled store
(heads.training.anchor), weight soups (heads.artefacts.soup), and the cosine energy with each of them."""
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import headstore
from headstore.cli import main
from headstore.heads.training.anchor import AnchorSampler, anchor_penalty
from headstore.heads.training.batches import batch_losses, make_batch, prepare_data
from headstore.heads.training.resolved import resolve_stack
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.network.model import StackedMLP
from headstore.heads.artefacts.soup import soup_of
from headstore.heads.network.model import start_of
from headstore.heads.training.strength import choose, with_strength
from headstore.heads.training.train import train_one

from .synthetic import planted_ir_task

SHAPES = [HeadConfig(in_dim=12, hidden=10, depth=2), HeadConfig(in_dim=12, depth=1),
          HeadConfig(in_dim=12, hidden=10, depth=2, residual=False, out_dim=6)]


def _trained_like(cfg: HeadConfig, seed: int = 0) -> StackedMLP:
    """A stack whose every parameter moved away from its start (as training would move it)."""
    m = StackedMLP(2, cfg, seeds=[seed, seed + 1])
    gen = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return m


@pytest.mark.parametrize("cfg", SHAPES, ids=["residual-2", "residual-1", "plain-2"])
def test_strength_zero_is_the_start_and_one_the_trained_head(cfg):
    m = _trained_like(cfg)
    x = torch.randn(9, 12)
    start = start_of(m)
    assert torch.equal(with_strength(m, [0.0, 0.0])(x), start(x))  # bit for bit
    if cfg.residual:
        assert torch.equal(with_strength(m, [0.0, 0.0])(x), x.expand(2, -1, -1))  # the identity, exactly
    assert torch.equal(with_strength(m, [1.0, 1.0])(x), m(x))
    for name, p in with_strength(m, [1.0, 1.0]).named_parameters():
        assert torch.equal(p, m.get_parameter(name))


def test_strength_of_a_residual_head_scales_its_update():
    m = _trained_like(SHAPES[0])
    x = torch.randn(9, 12)
    half = with_strength(m, [0.5, 0.25])
    g = m(x) - x  # the trained update of each head
    torch.testing.assert_close(half(x)[0], x + 0.5 * g[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(half(x)[1], x + 0.25 * g[1], rtol=1e-5, atol=1e-6)
    # only g's last layer moved: the hidden layer keeps its trained weights
    assert torch.equal(half.weights[0], m.weights[0])


def test_strength_rule_takes_the_best_dev_within_delta_and_ties_to_the_larger():
    curve = [{"strength": a, "dev": d, "ood_loss": l} for a, d, l in
             [(0.0, 0.60, -0.01), (0.5, 0.70, 0.005), (0.8, 0.70, 0.009), (1.0, 0.75, 0.03)]]
    assert choose([curve], delta=0.01) == [0.8]  # 1.0 loses more than delta; 0.5 and 0.8 tie on dev
    assert choose([[{**p, "ood_loss": p["ood_loss"] + 1} for p in curve]], 0.01) == [0.0]  # none within: least-losing
    assert choose([[{"strength": p["strength"], "dev": p["dev"]} for p in curve]], 0.01) == [1.0]  # dev alone


def _ir_training(**settings):
    task, X = planted_ir_task(n_docs=200, dim=12)
    cfg = TrainConfig(epochs=3, batch_size=16, mined_k=2, lr=1e-2, **settings)
    return task, X, cfg


def test_strength_auto_in_training_records_its_curve_and_applies_the_chosen_a():
    task, X, cfg = _ir_training(strength="auto")
    head_cfg = HeadConfig(in_dim=12, hidden=16)
    model, norm, run = train_one(task, X, head_cfg, cfg, progress=False)
    full, _, run1 = train_one(task, X, head_cfg, cfg.replace(strength="1"), progress=False)
    assert [p["strength"] for p in run.strength_curve] == pytest.approx([i / 10 for i in range(11)])
    best = max(run.strength_curve, key=lambda p: (p["dev"], p["strength"]))
    assert run.strength == best["strength"]
    x = norm(X[:20])
    torch.testing.assert_close(model(x), with_strength(full, [run.strength])(x))  # the same training, scaled


def test_anchor_penalty_is_zero_at_the_identity_and_pulls_toward_it():
    m = StackedMLP(1, HeadConfig(in_dim=12, hidden=10), seeds=[0])  # residual: starts as the identity
    x = torch.randn(1, 30, 12)
    assert torch.equal(anchor_penalty(m, x), torch.zeros(1))
    task, X, cfg = _ir_training()
    head_cfg = HeadConfig(in_dim=12, hidden=16)
    sample = torch.randn(400, 12)

    def distance(model, norm):  # mean ||f(x) - x||_1 on rows the anchor never sampled
        with torch.no_grad():
            return float(anchor_penalty(model, norm(sample).unsqueeze(0)))
    free = distance(*train_one(task, X, head_cfg, cfg.replace(guard=False), progress=False)[:2])
    held = distance(*train_one(task, X, head_cfg, cfg.replace(guard=False, anchor_weight=3.0), progress=False)[:2])
    assert held < 0.5 * free


def test_anchor_rows_are_the_tasks_own_texts_without_training_dev_or_test_texts():
    """Issue 54 item 3: the anchor samples only texts the user may train on: here the corpus, never a training
    text, never a dev or test query (they were drawn from every row: the queries and other datasets' texts)."""
    from headstore.heads.kinds import held_out_rows
    from headstore.heads.training.anchor import anchor_pool, own_texts

    task, X, cfg = _ir_training()
    data = prepare_data(task, X, cfg.loss, cfg.normalize)
    train_rows = np.concatenate([data.pairs.anchor, data.pairs.positive])
    pool = anchor_pool(task, *own_texts(task))
    want = [r for r in range(len(X)) if r in set(task.corpus_rows.tolist()) and r not in set(train_rows.tolist())]
    assert pool.rows.tolist() == want  # a loop's answer: corpus documents that are no training text
    assert pool.report["from"] == "the task's corpus documents" and pool.report["rows"] == len(want)
    assert pool.report["training_texts_left_out"] == len(np.unique(data.pairs.positive))
    sampler = AnchorSampler(pool, cfg.anchor_weight, [cfg.seed, 1])
    drawn = sampler.sample()
    assert drawn.shape == (2, min(128, len(want)))
    assert not np.isin(drawn.numpy(), train_rows).any() and not np.isin(drawn.numpy(), held_out_rows(task)).any()
    m = StackedMLP(1, HeadConfig(in_dim=12, hidden=10), seeds=[0])
    batch = make_batch(data, torch.arange(8).unsqueeze(0), None)
    plan = resolve_stack([cfg])
    plain = batch_losses(m, data.X, batch, plan)
    assert torch.equal(batch_losses(m, data.X, batch, plan, anchor=drawn[:1]), plain)  # weight 0: off


def test_a_stack_given_no_anchor_rows_never_samples_a_dev_or_test_query():
    """`cli distill` and the API pass no anchor rows: the default was every row but the training texts, dev and
    test queries included (issue 54, item 3); it is the task's own trainable texts (here its corpus)."""
    from headstore.heads.kinds import held_out_rows
    from headstore.heads.training.train import StackTraining

    task, X, cfg = _ir_training(anchor_weight=1.0)
    run = StackTraining(task, X, HeadConfig(in_dim=12, hidden=10), resolve_stack([cfg]), "dev", None, None)
    pool = run.anchor.pool.numpy()
    assert len(pool) and not np.isin(pool, held_out_rows(task)).any() and np.isin(pool, task.corpus_rows).all()
    assert run.anchor.report["from"] == "the task's corpus documents"


def test_a_task_with_no_text_of_its_own_to_anchor_on_is_refused_in_one_line():
    from .synthetic import planted_sts_task

    task, X = planted_sts_task(n_pairs=60, dim=12)  # an STS table without --unlabeled: no text but its own pairs
    cfg = TrainConfig(epochs=1, batch_size=16, anchor_weight=1.0)
    with pytest.raises(ValueError, match=r"--anchor-weight 1: no text to anchor on .*--unlabeled"):
        train_one(task, X, HeadConfig(in_dim=12, hidden=10), cfg, progress=False)


def test_a_soup_of_one_head_is_that_head_and_of_two_is_their_mean():
    a, b = _trained_like(SHAPES[1]).head_slice(0), _trained_like(SHAPES[1], seed=5).head_slice(0)
    one = soup_of([a])
    for name, p in one.named_parameters():
        assert torch.equal(p, a.get_parameter(name))
    two = soup_of([a, b])  # linear residual heads start at zero whatever the seed: they soup
    torch.testing.assert_close(two.weights[0], (a.weights[0] + b.weights[0]) / 2)
    deep = _trained_like(SHAPES[0])
    with pytest.raises(ValueError, match="share their starting weights"):
        soup_of([deep.head_slice(0), deep.head_slice(1)])  # seeds 0 and 1 draw other hidden layers


@pytest.fixture(scope="module")
def lever_grid(world, tmp_path_factory):
    spec = tmp_path_factory.mktemp("lever-grid") / "grid.toml"
    spec.write_text('[grid]\nlr = [1e-3, 3e-3, 1e-2]\nseed = [0, 1]\nenergy = ["l1", "cosine"]\n'
                    '[fixed]\nepochs = 2\nbatch_size = 8\nhidden = 16\nmined_k = 2\nstrength = "auto"\n'
                    'anchor_weight = 0.1\n')
    out = spec.parent / "out"
    r = CliRunner().invoke(main, ["grid", "--store", str(world.store), "--data", str(world.beir), "--grid", str(spec),
                                  "--out", str(out), "--soup", "1", "--soup", "3"])
    assert r.exit_code == 0, r.output
    return out


def test_grid_soup_of_one_is_the_best_head_and_soups_load_and_export(world, lever_grid, tmp_path):
    from sentence_transformers import SentenceTransformer

    info = json.loads((lever_grid / "soups.json").read_text())
    for rec in info["per_seed"]:
        if rec["k"] == 1:
            assert rec["dev_primary"] == pytest.approx(
                headstore.Head.load(f"{lever_grid}#id={rec['head_ids'][0]}").config["grid"]["dev_primary"], abs=1e-6)
    soup = headstore.Head.load(f"{lever_grid}#soup=3")
    members = [headstore.Head.load(f"{lever_grid}#id={h}") for h in soup.config["soup"]["head_ids"]]
    assert len(members) == 3 and len({m.train_config.seed for m in members}) == 1  # 2-layer: one seed's heads
    for name, p in soup.model.named_parameters():
        torch.testing.assert_close(p, torch.stack([m.model.get_parameter(name) for m in members]).mean(0))
    one = headstore.Head.load(f"{lever_grid}#soup=1")
    best = headstore.Head.load(f"{lever_grid}#rank=1")
    for name, p in one.model.named_parameters():
        assert torch.equal(p, best.model.get_parameter(name))
    r = CliRunner().invoke(main, ["export", "--head", f"{lever_grid}#soup=3", "--format", "sentence-transformers",
                                  "--out", str(tmp_path / "st")])
    assert r.exit_code == 0, r.output
    texts = headstore.Store.open(world.store).texts["text"].to_list()[:20]
    got = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(got, headstore.Pipeline.from_head(soup).encode(texts), rtol=0, atol=1e-5)


def test_grid_soups_of_heads_that_start_alike_count_once_with_no_spread_claimed(world, tmp_path):
    spec = tmp_path / "grid.toml"  # linear residual heads start at zero whatever their seed: K = 4 is all of them
    spec.write_text('[grid]\nlr = [1e-3, 3e-3]\nseed = [0, 1]\n[fixed]\ndepth = 1\nepochs = 1\nbatch_size = 8\n'
                    'mined_k = 2\n')
    r = CliRunner().invoke(main, ["grid", "--store", str(world.store), "--data", str(world.beir), "--grid", str(spec),
                                  "--out", str(tmp_path / "out"), "--soup", "4"])
    assert r.exit_code == 0, r.output
    info = json.loads((tmp_path / "out" / "soups.json").read_text())
    (row,) = info["rows"]
    assert len(info["per_seed"]) == 1 and row["seeds"] == 1 and row["seeds_tried"] == 2
    assert row["test_std"] is None and row["dev_std"] is None  # one soup: no seed spread to report
    assert "seed 1: the same heads as seed 0's soup; counted once" in r.output


def test_grid_rows_record_the_chosen_strength_for_both_energies(lever_grid):
    import polars as pl

    rows = pl.read_parquet(lever_grid / "results.parquet")
    assert set(rows["energy"]) == {"l1", "cosine"} and set(rows["status"]) == {"ok"}
    for row in rows.iter_rows(named=True):
        curve = json.loads(row["strength_curve"])
        assert row["strength_chosen"] == max(curve, key=lambda p: (p["dev"], p["strength"]))["strength"]
        assert row["dev_primary"] == pytest.approx(
            next(p["dev"] for p in curve if p["strength"] == row["strength_chosen"]), abs=1e-6)


@pytest.mark.parametrize("energy", ["l1", "cosine"])
def test_train_head_strength_exports_exactly_and_writes_its_curve(world, tmp_path, energy):
    from sentence_transformers import SentenceTransformer

    out = tmp_path / "head"
    r = CliRunner().invoke(main, ["train-head", "--store", str(world.store), "--data", str(world.beir), "--out",
                                  str(out), "--hidden", "16", "--epochs", "2", "--batch-size", "8", "--mined-k", "2",
                                  "--energy", energy, "--strength", "0.5", "--anchor-weight", "0.1"])
    assert r.exit_code == 0, r.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["strength"]["chosen"] == 0.5 and (out / "strength.png").is_file()
    assert json.loads((out / "config.json").read_text())["train"]["strength"] == "0.5"
    r = CliRunner().invoke(main, ["export", "--head", str(out), "--format", "sentence-transformers",
                                  "--out", str(tmp_path / "st")])
    assert r.exit_code == 0, r.output
    texts = headstore.Store.open(world.store).texts["text"].to_list()[:20]
    got = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(got, headstore.Pipeline.from_head(headstore.Head.load(out)).encode(texts),
                               rtol=0, atol=1e-5)


def test_bad_strength_is_refused_naming_the_valid_values(world, tmp_path):
    r = CliRunner().invoke(main, ["train-head", "--store", str(world.store), "--data", str(world.beir), "--out",
                                  str(tmp_path / "h"), "--strength", "1.5"])
    assert r.exit_code != 0 and "strength must be 'auto' or a number in [0, 1]" in r.output


def test_train_head_ir_default_anchors_and_a_given_weight_wins(world, tmp_path):
    from headstore.heads.kinds.ir import ANCHOR_IR

    def trained(name, *args):
        r = CliRunner().invoke(main, ["train-head", "--store", str(world.store), "--data", str(world.beir), "--out",
                                      str(tmp_path / name), "--hidden", "16", "--epochs", "1", "--batch-size", "8",
                                      "--mined-k", "2", *args])
        assert r.exit_code == 0, r.output
        return json.loads((tmp_path / name / "config.json").read_text())

    assert trained("default")["train"]["anchor_weight"] == ANCHOR_IR > 0
    assert trained("given", "--anchor-weight", "0")["train"]["anchor_weight"] == 0.0
    narrow = trained("narrow", "--no-residual", "--out-dim", "8")  # no f(x) - x to take: the default leaves it off
    assert narrow["train"]["anchor_weight"] == 0.0


def test_anchor_rows_of_a_beir_task_never_read_another_dataset_of_the_store(world):
    """Issue 54 item 3: unset --anchor-data, the pool is the task's corpus (no query, no other dataset's text);
    --anchor-data naming the task itself still leaves its dev and test queries out."""
    import headstore.heads.training.anchor as anchor
    from headstore.featurize.store.reader import FeatureStore
    from headstore.heads.kinds import held_out_rows, load_task

    store = FeatureStore.open(world.store)
    task = load_task(str(world.beir), store)
    pool = anchor.anchor_rows_of(store, task, 1.0)
    assert set(pool.rows.tolist()) == set(task.corpus_rows.tolist()) - set(task.train.positive.tolist())
    assert pool.report["dev_test_texts_left_out"] == 0 and len(pool.rows) < store.n_texts
    named = anchor.anchor_rows_of(store, task, 1.0, str(world.beir))
    assert not np.isin(named.rows, held_out_rows(task)).any() and not np.isin(named.rows, task.train.anchor).any()
    assert named.report["dev_test_texts_left_out"] == len(held_out_rows(task))
    assert anchor.anchor_rows_of(store, task, TrainConfig().anchor_weight) is None  # no anchor, nothing read
