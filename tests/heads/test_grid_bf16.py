"""A grid in bf16 (heads' matmuls under autocast) against the same grid in fp32, the reference maths, on a tiny
store: the numerics are part of each head's id and config, and the leaderboard keeps its order."""
import json

import polars as pl
from click.testing import CliRunner

from headstore.cli import main

SETTINGS = ["lr", "weight_decay", "seed"]


def test_bf16_grid_matches_the_fp32_grid_within_tolerance(data_world, tmp_path):
    spec = tmp_path / "grid.toml"
    spec.write_text('[grid]\nprecision = ["fp32", "bf16"]\nlr = [1e-4, 1e-2]\nweight_decay = [0.0, 0.5]\nseed = [0, 1]\n'
                    '[fixed]\nepochs = 3\nbatch_size = 8\nhidden = 16\ndepth = 2\nout_dim = 16\nresidual = false\n')
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["grid", "--store", str(data_world["store"]), "--data", str(data_world["sts05"]),
                                  "--grid", str(spec), "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = pl.read_parquet(out / "results.parquet")
    fp32, bf16 = (rows.filter(pl.col("precision") == p).sort(SETTINGS) for p in ("fp32", "bf16"))
    assert fp32.height == bf16.height == 8 and set(fp32["head_id"]).isdisjoint(bf16["head_id"])  # in the key
    stacks = {json.loads((out / "heads" / f"{s}.json").read_text())["train"][0]["precision"]
              for s in rows["stack"].unique()}
    assert stacks == {"fp32", "bf16"}  # recorded beside the weights
    diff = (fp32["dev_primary"] - bf16["dev_primary"]).abs()  # random scores (no signal): the mechanics only; on
    assert diff.max() <= 0.06, diff.to_list()  # 12 dev pairs two ranks swapped move a Spearman by up to 0.056
    assert " bf16 " in (out / "leaderboard.md").read_text()  # a column of the leaderboard


def test_bf16_stack_keeps_the_fp32_leaderboard_on_a_planted_relation():
    """The ranking of configurations (mean dev over seeds) that fp32 gives, bf16 gives too, each head's dev within
    bf16's rounding, on graded pairs whose score a head can learn (heads.kinds: STS)."""
    import dataclasses
    import itertools

    from headstore.heads.settings.config import HeadConfig, TrainConfig
    from headstore.heads.training.train import train_stack

    from .synthetic import planted_sts_task

    task, X = planted_sts_task(n_pairs=600)
    head = HeadConfig(depth=1, out_dim=8, in_dim=16, residual=False)
    grid = list(itertools.product([1e-4, 1e-3, 1e-2], [0.0, 0.5], [0, 1]))
    means = {}
    for precision in ("fp32", "bf16"):
        base = TrainConfig(normalize="none", loss="l1-energy", epochs=10, batch_size=32, patience=10, q=4.0,
                           precision=precision)
        configs = [dataclasses.replace(base, lr=lr, weight_decay=wd, seed=s) for lr, wd, s in grid]
        _, _, runs = train_stack(task, X, head, configs, progress=False)
        devs = {}
        for (lr, wd, _), run in zip(grid, runs):
            devs.setdefault((lr, wd), []).append(run.best_dev)
        means[precision] = {k: sum(v) / len(v) for k, v in devs.items()}
    diff = [abs(means["fp32"][k] - means["bf16"][k]) for k in means["fp32"]]
    assert max(diff) < 0.01, means
    order = [sorted(m, key=m.get, reverse=True) for m in means.values()]
    assert order[0][0] == order[1][0]  # the same best configuration
    spread = means["fp32"][order[0][0]] - means["fp32"][order[0][-1]]
    assert spread > 0.05, means  # among configurations that differ
