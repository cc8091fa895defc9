"""Out-of-domain selection (heads.training.selection): the rule, the split it may use, and a grid's ranking under it."""
import polars as pl
import pytest

from headstore.heads.artefacts.files import ranked_configs
from headstore.heads.training.selection import rule_key, selection_split
from headstore.heads.kinds import Task


def test_rule_prefers_the_best_dev_within_delta_else_the_least_losing():
    cands = {"a": (0.80, 0.030), "b": (0.78, 0.009), "c": (0.75, -0.01), "d": (0.82, 0.02)}
    best = max(cands, key=lambda n: rule_key(*cands[n], 0.01))
    assert best == "b"  # the best dev among those losing <= 0.01 out of domain
    losing = {n: v for n, v in cands.items() if v[1] > 0.01}
    assert max(losing, key=lambda n: rule_key(*losing[n], 0.01)) == "d"  # none within: the least-losing
    assert rule_key(0.5, None, 0.01) > rule_key(0.4, None, 0.01)  # no sets: dev alone


@pytest.mark.parametrize("splits, want", [(("dev", "test"), "dev"), (("train", "test"), "train"),
                                          (("train", "dev", "test"), "dev")])
def test_selection_split_is_dev_else_train_never_test(splits, want):
    task = Task("t", "sts", None, {s: None for s in splits})
    assert selection_split(task, "path") == want
    with pytest.raises(ValueError, match="never selected on"):
        selection_split(Task("t", "sts", None, {"test": None}), "path")


def test_grid_ranking_applies_the_rule_to_means_over_seeds():
    rows = []
    for lr, devs, losses in ((1e-3, (0.80, 0.82), (0.03, 0.05)), (3e-3, (0.78, 0.78), (0.0, 0.01)),
                             (1e-2, (0.70, 0.72), (0.02, 0.02))):
        for seed, (dev, loss) in enumerate(zip(devs, losses)):
            rows.append({"head_id": f"{lr}-{seed}", "status": "ok", "loss": "l1-energy", "lr": lr, "seed": seed,
                         "dev_primary": dev, "sel_loss": loss, "sel_delta": 0.01, "sel_x_primary": 0.5})
    groups, keys = ranked_configs(pl.DataFrame(rows))
    assert [g["lr"][0] for g in groups] == [3e-3, 1e-2, 1e-3]  # within delta, then the least-losing
    assert "sel_loss" not in keys and "sel_x_primary" not in keys


# ------------------------------------------------------------------------ in training: guard and rule


def test_tracker_keeps_the_rule_best_epoch_and_the_guarded_start():
    import torch

    from headstore.heads.settings.config import TrainConfig
    from headstore.heads.training.tracker import HeadTracker

    w = torch.nn.Parameter(torch.zeros(2, 1))
    tracker = HeadTracker([TrainConfig(), TrainConfig(seed=1)], [w], patience=5, delta=0.01)
    tracker.start([0.50, 0.50], [0.0, 0.0], guard=True)
    for epoch, (devs, losses) in enumerate([((0.60, 0.45), (0.02, 0.0)), ((0.55, 0.48), (0.005, 0.0))], 1):
        with torch.no_grad():
            w.fill_(float(epoch))
        tracker.end_epoch(epoch, torch.zeros(2), list(devs), "m", epoch, list(losses))
    tracker.restore_best()
    assert [r.best_epoch for r in tracker.runs] == [2, 0]  # head 0: epoch 1 loses 0.02 out of domain; head 1: never beat its start
    assert w.tolist() == [[2.0], [0.0]]  # the kept weights: epoch 2, and the starting point
    assert tracker.runs[0].best_sel_loss == 0.005 and tracker.runs[1].start_dev == 0.5


@pytest.mark.parametrize("guard", [True, False])
def test_guard_returns_the_starting_point_when_training_only_hurts(guard):
    import dataclasses

    import numpy as np
    import torch

    from headstore.heads.settings.config import TrainConfig
    from headstore.heads.evaluation.evaluate import embedder, evaluate_split
    from headstore.heads.settings.config import HeadConfig
    from headstore.heads.training.train import train_stack

    from .synthetic import planted_ir_task

    from headstore.heads.kinds import PairSet

    task, X = planted_ir_task(n_docs=120)
    X[120:] = X[:120] + 1.0 * torch.randn(120, 16, generator=torch.Generator().manual_seed(0))  # queries near their doc
    train = task.train  # trained on the wrong documents: training can only move the head away from dev's relation
    wrong = PairSet(train.anchor, np.roll(train.positive, 1))
    task = dataclasses.replace(task, train=wrong, relevant=set(zip(wrong.anchor.tolist(), wrong.positive.tolist())))
    cfg = TrainConfig(normalize="none", impostors="all", mined_k=0, epochs=3, batch_size=16, lr=1e-1, q=8.0,
                      patience=5, guard=guard)
    head_cfg = HeadConfig(depth=1, in_dim=16)
    model, norm, (run,) = train_stack(task, X, head_cfg, [cfg], progress=False)
    start, _ = evaluate_split(task, "dev", embedder(None, norm(X)), ("l1",))
    assert run.start_dev == pytest.approx(start[0]["manhattan_ndcg@10"])
    trained = max(h["dev_manhattan_ndcg@10"] for h in run.history)
    assert trained < run.start_dev  # training only hurt
    if guard:
        assert run.best_epoch == 0 and run.best_dev == run.start_dev
        assert all(torch.count_nonzero(p) == 0 for p in model.parameters())  # the identity head itself
    else:
        assert run.best_epoch >= 1 and run.best_dev == trained


def test_train_head_reports_a_head_worse_than_no_head(data_world, tmp_path):
    import json

    from .conftest import FAST, cli

    out = tmp_path / "bad"
    r = cli("train-head", "--store", data_world["store"], "--data", data_world["sts05"], "--out", out, *FAST,
            "--no-guard", "--lr", "5", "--grad-clip", "0", "--normalize", "none", "--graded", "weight", "--depth", "2")
    assert r.exit_code == 0, r.output
    guard = json.loads((out / "metrics.json").read_text())["guard"]
    assert guard["enabled"] is False and guard["worse_than_frozen"] is True
    assert "WORSE than no head" in guard["warning"] and "--graded pearson" in guard["warning"]
    assert "WARNING" in r.output
    out2 = tmp_path / "guarded"
    r = cli("train-head", "--store", data_world["store"], "--data", data_world["sts05"], "--out", out2, *FAST,
            "--lr", "5", "--grad-clip", "0")
    assert r.exit_code == 0, r.output
    guard = json.loads((out2 / "metrics.json").read_text())["guard"]
    assert guard["enabled"] is True and guard["head_dev"] >= guard["start_dev"]  # never below its starting point
    assert (guard["best_epoch"] == 0) == ("starting point" in guard["returned"])


def test_select_ood_in_train_head_and_grid(data_world, tmp_path):
    import json

    from .conftest import FAST, cli

    w = data_world
    out = tmp_path / "head"
    r = cli("train-head", "--store", w["store"], "--data", w["pos"], "--out", out, *FAST, "--epochs", "2",
            "--select-ood", w["sts05"], "--select-ood", w["labelled"], "--ood-delta", "0.02")
    assert r.exit_code == 0, r.output
    metrics = json.loads((out / "metrics.json").read_text())
    sel = metrics["selection"]
    assert sel["delta"] == 0.02 and {s["split"] for s in sel["sets"].values()} == {"dev"}
    kept = [h for h in metrics["history"] if h["epoch"] == metrics["guard"]["best_epoch"]]
    if kept:  # an epoch (not the start) was kept: its recorded out-of-domain loss is the selection's
        assert kept[0]["ood_dev_loss"] == pytest.approx(sel["ood_dev_loss"])
    grid = tmp_path / "g.toml"
    grid.write_text('[grid]\nlr = [1e-3, 1e-2]\n[fixed]\nepochs = 2\nbatch_size = 8\nhidden = 16\nmined_k = 2\n')
    r = cli("grid", "--store", w["store"], "--data", w["pos"], "--grid", grid, "--out", tmp_path / "gout",
            "--select-ood", w["sts05"])
    assert r.exit_code == 0, r.output
    import polars as pl

    res = pl.read_parquet(tmp_path / "gout" / "results.parquet")
    assert {"sel_loss", "sel_delta"} <= set(res.columns) and res["sel_delta"].to_list() == [0.01, 0.01]
    assert "out-of-domain selection" in (tmp_path / "gout" / "leaderboard.md").read_text()


def test_select_ood_never_uses_a_test_split(data_world, tmp_path):
    from .conftest import FAST, assert_bad_input, cli

    test_only = tmp_path / "testonly.parquet"
    import polars as pl

    pl.read_parquet(data_world["sts05"]).filter(pl.col("split") == "test").write_parquet(test_only)
    r = cli("train-head", "--store", data_world["store"], "--data", data_world["pos"], "--out", tmp_path / "h",
            *FAST, "--select-ood", test_only)
    assert_bad_input(r, "never selected on")


def test_train_head_defaults_depend_on_the_kind_of_data(data_world, tmp_path):
    """Graded (STS) tables take the STS kind's defaults for settings left unset; IR data the dataclass defaults;
    a value the user gives always wins."""
    import json

    from headstore.heads.settings.config import TrainConfig
    from headstore.heads.kinds.sts import KIND as STS_KIND
    from headstore.heads.settings.config import HeadConfig

    from .conftest import cli

    fast = ("--hidden", "16", "--batch-size", "8", "--mined-k", "2")

    def config(data, *extra):
        out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        r = cli("train-head", "--store", data_world["store"], "--data", data, "--out", out, *fast, *extra)
        assert r.exit_code == 0, r.output
        return json.loads((out / "config.json").read_text())

    sts = config(data_world["sts05"], "--epochs", "1")
    assert sts["head"]["depth"] == STS_KIND.defaults["depth"] and sts["train"]["lr"] == STS_KIND.defaults["lr"]
    assert "graded data" in sts["defaults"]
    ir = config(data_world["beir"], "--epochs", "1")
    assert ir["head"]["depth"] == HeadConfig().depth and ir["train"]["lr"] == TrainConfig().lr
    given = config(data_world["sts05"], "--depth", "2", "--lr", "0.01", "--epochs", "1")
    assert given["head"]["depth"] == 2 and given["train"]["lr"] == 0.01
