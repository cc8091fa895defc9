"""A grid over a corpus above exact_max (heads.experiments.grid.run, --test-scope): dev is reported on the same
candidates each epoch was selected on, and test is ranked exactly, once, for the heads of each stack's dev-best
configuration only; the figures equal those of a grid that tests every head, and a head's reported dev equals
the candidate dev recomputed from its saved weights."""
import json

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from headstore.cli import main
from headstore.heads.artefacts.files import ranked_configs

SPEC = ('[grid]\nlr = [1e-4, 3e-2]\nweight_decay = [0.0, 0.1]\nseed = [0, 1]\n'
        '[fixed]\nepochs = 3\nbatch_size = 8\nhidden = 16\nmined_k = 2\nexact_max = 0\npool_k = 20\nguard = false\n')


def _grid(world, tmp, scope=None):
    spec = tmp / "grid.toml"
    spec.write_text(SPEC)
    out = tmp / f"out-{scope}"
    args = ["grid", "--store", str(world.store), "--data", str(world.beir), "--grid", str(spec), "--out", str(out)]
    r = CliRunner().invoke(main, args + (["--test-scope", scope] if scope else []))
    assert r.exit_code == 0, r.output
    frame = pl.read_parquet(out / "results.parquet")
    return frame.with_columns(pl.lit((out / "leaderboard.md").read_text()).alias("leaderboard"))


@pytest.fixture(scope="module")
def grids(world, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gridscale")
    return _grid(world, tmp), _grid(world, tmp, "all")


def test_only_the_dev_best_configuration_is_tested_and_its_test_equals_a_full_run(grids):
    auto, every = grids
    assert auto["dev_ranked"].unique().to_list() == ["candidates"] and auto.height == 8
    tested = auto.filter(pl.col("test_scored"))
    assert every["test_scored"].all() and every["test_primary"].null_count() == 0
    assert auto.filter(~pl.col("test_scored"))["test_primary"].null_count() == auto.height - tested.height
    # the tested heads are exactly one configuration (every seed) and it is the best by mean dev
    assert tested.height == 2 and sorted(tested["seed"].to_list()) == [0, 1]
    assert tested.select("lr", "weight_decay").unique().height == 1
    best = ranked_configs(auto)[0][0]  # the grid's one ranking (the leaderboard's rank 1)
    assert sorted(tested["head_id"]) == sorted(best["head_id"])
    board = auto["leaderboard"][0]  # says how dev and test were ranked; untested configurations show "–"
    assert "Dev ranked on candidates" in board and "dev-best configuration only" in board
    assert board.count("| –") >= 2 * 3 and "dev-best configuration only" not in every["leaderboard"][0]
    assert auto["dev_primary"].n_unique() > 1  # a real choice was made
    # the same heads, the same numbers: dev (candidates) for every head, test for those tested
    auto, every = auto.sort("head_id"), every.sort("head_id")
    assert auto["dev_primary"].to_list() == every["dev_primary"].to_list()
    got = dict(zip(tested["head_id"], tested["test_primary"]))
    want = dict(zip(every["head_id"], every["test_primary"]))
    assert all(np.isclose(got[h], want[h], rtol=0, atol=1e-12) for h in got)


def test_reported_dev_is_the_candidate_dev_the_epochs_were_selected_on(grids):
    auto, _ = grids
    for row in auto.iter_rows(named=True):  # the best epoch's per-epoch dev score (candidates) is the one reported
        at_best = [e for e in json.loads(row["history"]) if e["epoch"] == row["best_epoch"]]
        assert len(at_best) == 1 and at_best[0][f"dev_{row['primary']}"] == pytest.approx(row["dev_primary"], abs=1e-9)


def test_bad_test_scope_is_refused(world, tmp_path):
    spec = tmp_path / "g.toml"
    spec.write_text(SPEC)
    r = CliRunner().invoke(main, ["grid", "--store", str(world.store), "--data", str(world.beir), "--grid",
                                  str(spec), "--out", str(tmp_path / "o"), "--test-scope", "some"])
    assert r.exit_code != 0 and "auto" in r.output and "selected" in r.output


def test_resuming_under_another_test_scope_is_refused(world, tmp_path):
    """A grid's finished heads keep the test columns they were scored with: rerunning into the same --out under
    another --test-scope would mix two rules, so it is one error line naming both; the same scope resumes."""
    from .conftest import assert_bad_input

    frame = _grid(world, tmp_path, "all")
    assert frame["test_scope"].unique().to_list() == ["all"]
    spec, out = tmp_path / "grid.toml", tmp_path / "out-all"
    args = ["grid", "--store", str(world.store), "--data", str(world.beir), "--grid", str(spec), "--out", str(out)]
    r = CliRunner().invoke(main, args + ["--test-scope", "selected"])
    assert_bad_input(r, "--test-scope all", "--overwrite")
    r = CliRunner().invoke(main, args + ["--test-scope", "all"])
    assert r.exit_code == 0 and "8 already finished" in r.output, r.output
