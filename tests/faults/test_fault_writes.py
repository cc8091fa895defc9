"""A write error (ENOSPC, EDQUOT, EIO, EROFS, a vanished folder) injected at each write site of every command
that writes: the command ends within the bound with one line naming the file and the OS error, the store
verifies, and the same command run again gives what an uninterrupted run gives (features bit for bit,
metrics to 1e-6). The call that fails is picked by a seed among the calls an uninterrupted run makes."""
from __future__ import annotations

import shutil

import pytest
from fault_world import (TRAIN, assert_close, assert_ok, assert_store_equal, assert_write_error, cli, counted,
                         featurize_args, grid_rows, metrics_of, pick, store_snapshot)
from fault_inject import Fault
from fault_matrix import WRITE, cases

from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.verify import verify_store

@pytest.mark.parametrize("site,what,seed", cases(WRITE, "featurize"))
def test_featurize(world, tmp_path, site, what, seed):
    def run(fault):
        store = tmp_path.parent / f"count-{fault.site}" / "s"
        shutil.rmtree(store, ignore_errors=True)
        assert_ok(cli(*featurize_args(world, store), fault=fault))
        return None
    calls, _ = counted("featurize", run)
    fault = pick(calls, site, what, seed)
    store = tmp_path / "s"
    assert_write_error(cli(*featurize_args(world, store), fault=fault), fault)
    assert fault.fired
    if (store / "manifest.json").is_file():
        assert verify_store(store) == []  # what was committed is whole
    assert_ok(cli(*featurize_args(world, store)))  # the same command, the cause gone
    assert_store_equal(store, world["snapshot"])


def _train(world, out, fault=None):
    return cli("train-head", "--store", world["store"], "--data", world["pairs"], "--out", out, *TRAIN, fault=fault)


@pytest.mark.parametrize("site,what,seed", cases(WRITE, "train-head"))
def test_train_head(world, tmp_path, site, what, seed):
    def run(fault):
        out = tmp_path.parent / "train-count"
        assert_ok(_train(world, out, fault))
        return metrics_of(out)
    calls, reference = counted("train-head", run)
    fault = pick(calls, site, what, seed)
    out = tmp_path / "head"
    assert_write_error(_train(world, out, fault), fault)
    assert_ok(_train(world, out))  # the same command replaces the interrupted head
    assert_close(metrics_of(out), reference)


def _grid(world, out, fault=None):
    return cli("grid", "--store", world["store"], "--data", world["pairs"], "--grid", world["grid"], "--out", out,
               fault=fault)


@pytest.mark.parametrize("site,what,seed", cases(WRITE, "grid"))
def test_grid(world, tmp_path, site, what, seed):
    def run(fault):
        out = tmp_path.parent / "grid-count"
        assert_ok(_grid(world, out, fault))
        return grid_rows(out)
    calls, reference = counted("grid", run)
    fault = pick(calls, site, what, seed)
    out = tmp_path / "grid"
    assert_write_error(_grid(world, out, fault), fault)
    assert_ok(_grid(world, out))  # resumes
    rows = grid_rows(out)
    assert rows.keys() == reference.keys()  # every head once
    assert_close(rows, reference)


def _index(world, out, fault=None):
    return cli("index", "--store", world["store"], "--head", world["head"], "--data", world["pairs"], "--out", out,
               fault=fault)


@pytest.mark.parametrize("site,what,seed", cases(WRITE, "index"))
def test_index(world, tmp_path, site, what, seed):
    import polars as pl

    def run(fault):
        out = tmp_path.parent / "index-count"
        assert_ok(_index(world, out, fault))
        return (out / "index.faiss").read_bytes(), pl.read_parquet(out / "items.parquet")
    calls, (index_bytes, items) = counted("index", run)
    fault = pick(calls, site, what, seed)
    out = tmp_path / "index"
    assert_write_error(_index(world, out, fault), fault)
    assert_ok(_index(world, out))  # the same command replaces the interrupted index
    assert (out / "index.faiss").read_bytes() == index_bytes
    assert pl.read_parquet(out / "items.parquet").equals(items)


@pytest.mark.parametrize("site,what,seed", cases(WRITE, "export"))
def test_export(world, tmp_path, site, what, seed):
    import torch
    from safetensors.torch import load_file

    def run(fault):
        out = tmp_path.parent / "export-count"
        assert_ok(cli("export", "--head", world["head"], "--format", "safetensors", "--out", out, fault=fault))
        return load_file(out / "head.safetensors")
    calls, reference = counted("export", run)
    fault = pick(calls, site, what, seed)
    out = tmp_path / "export"
    args = ("export", "--head", world["head"], "--format", "safetensors", "--out", out)
    assert_write_error(cli(*args, fault=fault), fault)
    assert_ok(cli(*args))
    exported = load_file(out / "head.safetensors")
    assert exported.keys() == reference.keys() and all(torch.equal(exported[k], reference[k]) for k in reference)


@pytest.fixture
def two_part_store(world, store_copy):
    """The world's store with a second commit (more texts): parts to compact."""
    assert_ok(cli(*featurize_args(world, store_copy, world["more"])))
    assert len(FeatureStore.open(store_copy).manifest["parts"]) >= 2
    return store_copy


@pytest.mark.parametrize("site,what,seed", cases(WRITE, "store compact"))
def test_store_compact(world, two_part_store, site, what, seed):
    before = store_snapshot(two_part_store)
    fault = Fault(site, what, 1)  # compact writes one part, then the manifest: the first of either
    assert_write_error(cli("store", "compact", two_part_store, fault=fault), fault)
    assert_store_equal(two_part_store, before)  # untouched: the commit is the manifest
    assert_ok(cli("store", "compact", two_part_store))
    assert len(FeatureStore.open(two_part_store).manifest["parts"]) == 1
    assert_store_equal(two_part_store, before)


@pytest.mark.parametrize("site,what,seed", cases(WRITE, "store migrate"))
def test_store_migrate(world, tmp_path, site, what, seed):
    from store_helpers import make_format1_copy

    old = tmp_path / "v1"
    make_format1_copy(world["store"], old)
    counts = Fault("atomic")
    scratch = tmp_path / "count"
    make_format1_copy(world["store"], scratch)
    assert_ok(cli("store", "migrate", scratch, fault=counts))
    fault = pick(counts.calls, site, what, seed)
    assert_write_error(cli("store", "migrate", old, fault=fault), fault)
    assert verify_store(old) == []  # still the format-1 store (or already the whole format-2 one)
    assert_ok(cli("store", "migrate", old))
    assert FeatureStore.open(old).format_version == 2
    assert_store_equal(old, world["snapshot"])
