"""Every head of a `cli grid` output loads (Head.load("R#rank=1"), "R#id=..."), carrying what it was
evaluated with: its dev metric recomputed from the loaded head equals the grid's."""
import json

import numpy as np
import polars as pl
import pytest
import torch
from click.testing import CliRunner

import headstore
from headstore.cli import main
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.evaluation.evaluate import embedder, evaluate_split, primary_metric
from headstore.heads.network.features import load_features
from headstore.heads.kinds import load_task


@pytest.fixture(scope="module")
def grid(world, tmp_path_factory):
    spec = tmp_path_factory.mktemp("grid") / "grid.toml"
    spec.write_text('[grid]\nloss = ["l1-energy", "mnr"]\nlr = [1e-3, 3e-3]\nseed = [0, 1]\n'
                    '[fixed]\nepochs = 2\nbatch_size = 8\nhidden = 16\nmined_k = 2\n')
    out = spec.parent / "out"
    r = CliRunner().invoke(main, ["grid", "--store", str(world.store), "--data", str(world.beir), "--grid", str(spec),
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out, pl.read_parquet(out / "results.parquet")


def test_every_grid_head_loads_and_reproduces_its_dev_metric(world, grid):
    out, results = grid
    store = FeatureStore.open(world.store)
    task, X = load_task(str(world.beir), store), load_features(store)
    for row in results.filter(pl.col("status") == "ok").iter_rows(named=True):
        head = headstore.Head.load(f"{out}#id={row['head_id']}")
        assert head.config["grid"]["head_id"] == row["head_id"] and head.train_config.lr == row["lr"]
        energy = head.energy_name
        metrics, _ = evaluate_split(task, "dev", embedder(head.model, head.normalizer(X)), (energy,))
        assert metrics[0][primary_metric("ir", energy)] == pytest.approx(row["dev_primary"], abs=1e-6)


def test_rank_k_is_the_kth_configuration_by_mean_dev_metric(world, grid):
    out, results = grid
    ok = results.filter(pl.col("status") == "ok")
    means = ok.group_by("loss", "lr").agg(pl.col("dev_primary").mean())
    ranked = sorted(means["dev_primary"].to_list(), reverse=True)
    for k in (1, 2, 4):
        head = headstore.Head.load(f"{out}#rank={k}")
        loss, lr = head.train_config.loss, head.train_config.lr
        seeds = ok.filter((pl.col("loss") == loss) & (pl.col("lr") == lr))
        assert seeds["dev_primary"].mean() == pytest.approx(ranked[k - 1])  # (ties may swap equal configs)
        assert head.config["grid"]["dev_primary"] == pytest.approx(seeds["dev_primary"].max())  # best seed on dev


def test_export_grid_rank_as_safetensors_round_trips(world, grid, tmp_path):
    out, _ = grid
    dest = tmp_path / "best"
    r = CliRunner().invoke(main, ["export", "--grid", str(out), "--rank", "1", "--format", "safetensors", "--out", str(dest)])
    assert r.exit_code == 0, r.output
    X = torch.randn(5, headstore.Head.load(world.head).in_dim)
    np.testing.assert_array_equal(headstore.Head.load(dest).embed(X), headstore.Head.load(f"{out}#rank=1").embed(X))
    r = CliRunner().invoke(main, ["eval", "--store", str(world.store), "--head", str(dest), "--data", str(world.beir),
                                  "--out", str(tmp_path / "eval")])
    assert r.exit_code == 0, r.output  # an exported grid head is a head directory like train-head's


@pytest.mark.parametrize("suffix, error", [("", "name one of its heads"), ("#rank=99", "out of range"),
                                           ("#rank=zero", "positive integer"), ("#id=nope", "no head with id")])
def test_bad_grid_references_are_explained(grid, suffix, error):
    out, _ = grid
    with pytest.raises(ValueError, match=error):
        headstore.Head.load(f"{out}{suffix}")


def test_eval_takes_a_grid_reference(world, grid, tmp_path):
    out, _ = grid
    r = CliRunner().invoke(main, ["eval", "--store", str(world.store), "--head", f"{out}#rank=1", "--data",
                                  str(world.beir), "--out", str(tmp_path / "eval")])
    assert r.exit_code == 0, r.output
    best = headstore.Head.load(f"{out}#rank=1").config["grid"]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["head"][best["primary"]] == pytest.approx(best["test_primary"], abs=1e-6)
