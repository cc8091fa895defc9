"""SIGKILL and SIGINT at seeded points of a command run in a child process (at the N-th write of a site the
seed picks): SIGKILL leaves only whole commits, SIGINT exits 130 with one line and no traceback; either way
the store verifies and the same command run again gives what an uninterrupted run gives."""
from __future__ import annotations

import shutil

import pytest
from fault_world import (TRAIN, assert_close, assert_ok, assert_store_equal, assert_whole_commits, cli,
                         cli_child, counted,
                         featurize_args, grid_rows, metrics_of, pick, sigint_or_kill_ok, store_snapshot)
from fault_matrix import SIGNAL, cases

from headstore.featurize.store.verify import verify_store


def _featurize_counts(world, tmp_path):
    def run(fault):
        store = tmp_path.parent / "sig-count" / "s"
        shutil.rmtree(store, ignore_errors=True)
        assert_ok(cli(*featurize_args(world, store), fault=fault))
    return counted("featurize", run)[0]


@pytest.mark.parametrize("site,what,seed", cases(SIGNAL, "featurize"))
def test_featurize_signalled(world, tmp_path, site, what, seed):
    fault = pick(_featurize_counts(world, tmp_path), site, what, seed)
    store = tmp_path / "s"
    sigint_or_kill_ok(cli_child(*featurize_args(world, store), fault=fault.spec()), what)
    assert_whole_commits(store)
    assert_ok(cli(*featurize_args(world, store)))
    assert_store_equal(store, world["snapshot"])


@pytest.mark.parametrize("site,what,seed", cases(SIGNAL, "grid"))
def test_grid_signalled(world, tmp_path, site, what, seed):
    def run(fault):
        out = tmp_path.parent / "sig-grid-count"
        assert_ok(cli("grid", "--store", world["store"], "--data", world["pairs"], "--grid", world["grid"],
                      "--out", out, fault=fault))
        return grid_rows(out)
    calls, reference = counted("grid", run)
    fault = pick(calls, site, what, seed)
    args = ("grid", "--store", world["store"], "--data", world["pairs"], "--grid", world["grid"], "--out", tmp_path / "g")
    sigint_or_kill_ok(cli_child(*args, fault=fault.spec()), what)
    assert_ok(cli(*args))  # resumed
    assert_close(grid_rows(tmp_path / "g"), reference)


@pytest.mark.parametrize("site,what,seed", cases(SIGNAL, "train-head"))
def test_train_head_interrupted(world, tmp_path, site, what, seed):
    def run(fault):
        out = tmp_path.parent / "train-count"
        assert_ok(cli("train-head", "--store", world["store"], "--data", world["pairs"], "--out", out, *TRAIN,
                      fault=fault))
        return metrics_of(out)
    calls, reference = counted("train-head", run)
    fault = pick(calls, site, what, seed)
    args = ("train-head", "--store", world["store"], "--data", world["pairs"], "--out", tmp_path / "h", *TRAIN)
    sigint_or_kill_ok(cli_child(*args, fault=fault.spec()), what)
    assert_ok(cli(*args))  # the interrupted head is replaced
    assert_close(metrics_of(tmp_path / "h"), reference)


@pytest.mark.parametrize("site,what,seed", cases(SIGNAL, "store compact"))
def test_store_compact_killed(world, store_copy, site, what, seed):
    assert_ok(cli(*featurize_args(world, store_copy, world["more"])))
    before = store_snapshot(store_copy)
    sigint_or_kill_ok(cli_child("store", "compact", store_copy, fault=f"{site}:{what}:1"), what)  # the first
    assert_whole_commits(store_copy)
    assert store_snapshot(store_copy) == before
    assert_ok(cli("store", "compact", store_copy))
    assert_store_equal(store_copy, before)


@pytest.mark.parametrize("site,what,seed", cases(SIGNAL, "store migrate"))
def test_store_migrate_killed(world, tmp_path, site, what, seed):
    from store_helpers import make_format1_copy

    old = tmp_path / "v1"
    make_format1_copy(world["store"], old)
    sigint_or_kill_ok(cli_child("store", "migrate", old, fault=f"{site}:{what}:3"), what)  # the third
    assert verify_store(old) == []  # migrate stages beside the store: nothing of it is left in the store
    assert_ok(cli("store", "migrate", old))
    assert_store_equal(old, world["snapshot"])
