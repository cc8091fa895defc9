"""Faults across processes: the full-disk hang of issue 32 in a real child process, a store read while its
writer is killed, two grids into one --out at once, training while featurize appends to the store."""
from __future__ import annotations

import shutil
import time

from fault_world import (BOUND_S, TRAIN, assert_close, assert_ok, assert_store_equal, assert_whole_commits, cli,
                         cli_child, counted,
                         featurize_args, grid_rows, metrics_of, store_snapshot)

from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.verify import verify_store


def _featurize_calls(world, tmp_path) -> dict:
    def run(fault):
        store = tmp_path.parent / "proc-count" / "s"
        shutil.rmtree(store, ignore_errors=True)
        assert_ok(cli(*featurize_args(world, store), fault=fault))
    return counted("featurize", run)[0]


def test_a_full_disk_at_the_last_commit_ends_featurize_with_one_line(world, tmp_path):
    """The issue's hang: the writer thread fails on the final commit (its last shard write)."""
    last = _featurize_calls(world, tmp_path)["zarr"]
    store = tmp_path / "s"
    t0 = time.monotonic()
    proc = cli_child(*featurize_args(world, store), fault=f"zarr:ENOSPC:{last}")  # timeout: BOUND_S
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "No space left on device" in errors[0] and str(store) in errors[0], proc.stderr
    assert time.monotonic() - t0 < BOUND_S
    assert verify_store(store) == []
    assert_ok(cli(*featurize_args(world, store)))
    assert_store_equal(store, world["snapshot"])


def _read_until_done(proc, store, before: int, after: int) -> int:
    """Read the whole store again and again while `proc` runs; every read sees whole commits only."""
    reads = 0
    while proc.poll() is None:
        opened = FeatureStore.open(store)
        n = opened.n_texts
        assert before <= n <= after, n
        feats = opened.features()  # raises on a missing shard, a bad checksum, NaN/inf
        assert feats.shape[0] == n and opened.texts.height == n
        reads += 1
        time.sleep(0.01)  # a reader, not a second busy core: the writer gets the machine's other core
    proc.communicate(timeout=BOUND_S)
    return reads


def test_a_store_read_while_its_writer_is_killed(world, store_copy):
    before = FeatureStore.open(store_copy).n_texts
    # the append's last shard write: killed inside its (only) commit, while this process reads
    proc = cli_child(*featurize_args(world, store_copy, world["more"]), fault="zarr:SIGKILL:2", wait=False)
    reads = _read_until_done(proc, store_copy, before, before + 40)
    assert proc.returncode < 0 and reads >= 1, (proc.returncode, reads)
    assert_whole_commits(store_copy)
    assert FeatureStore.open(store_copy).n_texts == before
    assert_ok(cli(*featurize_args(world, store_copy, world["more"])))
    assert verify_store(store_copy) == [] and FeatureStore.open(store_copy).n_texts == before + 40


def test_two_grids_into_one_out_at_once(world, tmp_path):
    def run(fault):
        out = tmp_path.parent / "proc-grid-count"
        assert_ok(cli("grid", "--store", world["store"], "--data", world["pairs"], "--grid", world["grid"],
                      "--out", out, fault=fault))
        return grid_rows(out)
    reference = counted("grid", run)[1]
    args = ("grid", "--store", world["store"], "--data", world["pairs"], "--grid", world["grid"], "--out", tmp_path / "g")
    procs = [cli_child(*args, wait=False) for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=BOUND_S)
        assert proc.returncode == 0, err[-3000:]
    rows = grid_rows(tmp_path / "g")  # every configuration once
    assert rows.keys() == reference.keys()
    assert_close(rows, reference)


def test_train_head_while_featurize_appends(world, store_copy, tmp_path):
    def run(fault):
        out = tmp_path.parent / "train-count"
        assert_ok(cli("train-head", "--store", world["store"], "--data", world["pairs"], "--out", out, *TRAIN,
                      fault=fault))
        return metrics_of(out)
    reference = counted("train-head", run)[1]
    proc = cli_child(*featurize_args(world, store_copy, world["more"]), wait=False)
    assert_ok(cli("train-head", "--store", store_copy, "--data", world["pairs"], "--out", tmp_path / "h", *TRAIN))
    out, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 0, err[-3000:]
    assert verify_store(store_copy) == [] and FeatureStore.open(store_copy).n_texts == len(world["snapshot"]) + 40
    assert_close(metrics_of(tmp_path / "h"), reference)
    assert {k: v for k, v in store_snapshot(store_copy).items() if k in world["snapshot"]} == world["snapshot"]
