"""A grid's closing work (leaderboard, summary, plots): every file it wrote before is still written, and the
configurations' test CIs, computed side by side on threads, are each the CI the one-by-one loop gives."""
import json

import numpy as np

from headstore.heads.experiments.grid.run import run_grid

FILES = {"baseline.json", "best_curves.png", "by_setting.png", "configs.csv", "grid.toml", "heads", "judgements.parquet",
         "leaderboard.md", "results.csv", "results.parquet", "summary.json", "summary.md"}  # what a grid wrote


def test_the_grid_writes_every_file_and_its_cis_equal_the_loop(data_world, tmp_path):
    from headstore.featurize.store.reader import FeatureStore
    from headstore.heads.artefacts.files import ranked_configs
    from headstore.heads.experiments.grid.leaderboard import _ci, _group_cis, aggregate
    from headstore.heads.kinds import load_task

    spec = tmp_path / "grid.toml"
    spec.write_text('[grid]\nlr = [1e-3, 1e-2]\nweight_decay = [0.0, 0.1]\nseed = [0, 1, 2]\n'
                    '[fixed]\nepochs = 2\nbatch_size = 8\nhidden = 16\ndepth = 1\n')
    out = tmp_path / "out"
    frame = run_grid(str(data_world["store"]), str(data_world["sts05"]), str(spec), str(out), progress=False)
    assert {p.name for p in out.iterdir()} == FILES
    task = load_task(str(data_world["sts05"]), FeatureStore.open(str(data_world["store"])))
    groups, _ = ranked_configs(frame)
    loop = [_ci(task, [np.asarray(json.loads(x)) for x in g["test_items"]]) for g in groups]
    assert len(groups) == 4 and _group_cis(task, groups) == loop
    agg, _ = aggregate(frame, task)
    assert list(zip(agg["test_ci_lo"], agg["test_ci_hi"])) == loop
