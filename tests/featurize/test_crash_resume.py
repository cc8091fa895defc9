"""A real SIGKILL at each step of the commit protocol, then a rerun: the store must equal an
uninterrupted run's -- every text exactly once, same rows, identical features."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from headstore.data.text_id import text_ids
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.verify import verify_store

SETTINGS = dict(dtype="float32", batch_tokens=128, commit_seconds=0, chunk_rows=4, shard_rows=16,
                device="cpu", layers=(-1, -2), window_texts=25)  # 3 windows of the 60 texts

CHILD = textwrap.dedent("""
    import json, os, signal, sys
    args = json.loads(sys.argv[1])
    if args.get("die_inside_zarr_write"):
        # die half-way through zarr writing a shard file: the first bytes are on disk
        import zarr.storage._local as local
        calls = {"n": 0}
        real_put = local._put
        def dying_put(path, value, exclusive=False):
            if path.parent.name != "c" and "zarr.json" not in path.name:
                calls["n"] += 1
                if calls["n"] == args["die_inside_zarr_write"]:
                    with local._atomic_write(path, "wb") as f:
                        f.write(value.as_buffer_like()[: len(value) // 2])
                        f.flush()
                        os.kill(os.getpid(), signal.SIGKILL)
            return real_put(path, value, exclusive)
        local._put = dying_put
    from headstore.featurize.encoder.config import FeaturizeConfig
    from headstore.featurize.run.local import featurize_texts
    config = FeaturizeConfig(**{**args["config"], "layers": tuple(args["config"]["layers"])})
    featurize_texts(config, args["texts"], args["store"])
""")


def run_child(tiny_model, texts, store, crash_at=None, die_inside_zarr_write=None):
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if crash_at:
        env["HEADSTORE_CRASH_AT"] = crash_at
    args = {"config": {**SETTINGS, "model": tiny_model}, "texts": texts, "store": str(store),
            "die_inside_zarr_write": die_inside_zarr_write}
    return subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], env=env,
                          capture_output=True, text=True, timeout=120)


def snapshot(store_path):
    store = FeatureStore.open(store_path)
    rows = dict(zip(store.texts["text_id"], store.texts["row"]))
    return rows, {name: store.features(name) for name in store.arrays}, store.texts


@pytest.fixture(scope="module")
def uninterrupted(tiny_model, texts, tmp_path_factory):
    path = tmp_path_factory.mktemp("clean") / "s"
    featurize_texts(FeaturizeConfig(model=tiny_model, **SETTINGS), texts, path)
    return snapshot(path)


@pytest.mark.parametrize("crash_at", ["table_written:1",  # while creating the store
                                      "resized:2", "features_written:1", "features_written:4",
                                      "table_written:3", "committed:2"])
def test_sigkill_then_rerun_equals_uninterrupted(tiny_model, texts, tmp_path, uninterrupted,
                                                 crash_at):
    store = tmp_path / "s"
    result = run_child(tiny_model, texts, store, crash_at=crash_at)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    if (store / "manifest.json").exists():  # what was committed is readable and sound meanwhile
        committed = FeatureStore.open(store)
        assert committed.n_texts < len(texts)
        np.testing.assert_array_equal(committed.features(),
                                      uninterrupted[1]["features"][: committed.n_texts])
        # verify names only the leftovers of the interrupted commit, and says what completes it
        assert all("rerunning featurize into this store completes it" in p
                   for p in verify_store(store))
    featurize_texts(FeaturizeConfig(model=tiny_model, **SETTINGS), texts, store)
    assert verify_store(store) == []
    rows, feats, table = snapshot(store)
    assert rows == uninterrupted[0]  # every text exactly once, at the same row
    assert sorted(rows) == sorted(set(text_ids(texts)))
    for name in feats:
        np.testing.assert_array_equal(feats[name], uninterrupted[1][name])
    assert table.equals(uninterrupted[2])
    assert not list(store.rglob("*.partial")) and not list(store.glob(".*.tmp"))


def test_sigkill_inside_a_shard_write_keeps_committed_rows(tiny_model, texts, tmp_path,
                                                           uninterrupted):
    store = tmp_path / "s"
    result = run_child(tiny_model, texts, store, die_inside_zarr_write=5)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    assert list(store.rglob("*.partial"))  # the half-written temp file is there ...
    committed = FeatureStore.open(store)  # ... but committed shards are intact
    assert 0 < committed.n_texts < len(texts)
    np.testing.assert_array_equal(committed.features(),
                                  uninterrupted[1]["features"][: committed.n_texts])
    featurize_texts(FeaturizeConfig(model=tiny_model, **SETTINGS), texts, store)
    assert verify_store(store) == [] and not list(store.rglob("*.partial"))
    rows, feats, _ = snapshot(store)
    assert rows == uninterrupted[0]
    np.testing.assert_array_equal(feats["features"], uninterrupted[1]["features"])


def test_kill_at_a_random_moment(tiny_model, texts, tmp_path, uninterrupted):
    """An outside SIGKILL at an arbitrary time (not at a hook), then a rerun."""
    store = tmp_path / "s"
    args = {"config": {**SETTINGS, "model": tiny_model}, "texts": texts * 1, "store": str(store)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(args)],
                             env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
                             stderr=subprocess.PIPE, text=True)
    for line in iter(child.stderr.readline, ""):  # wait until encoding has begun
        if "featurize:" in line and "text/s" in line:
            break
    child.send_signal(signal.SIGKILL)
    child.wait()
    featurize_texts(FeaturizeConfig(model=tiny_model, **SETTINGS), texts, store)
    assert verify_store(store) == []
    rows, feats, _ = snapshot(store)
    assert rows == uninterrupted[0]
    np.testing.assert_array_equal(feats["features"], uninterrupted[1]["features"])


def test_verify_after_a_kill_says_rerun_completes_it(tiny_model, texts, tmp_path):
    store = tmp_path / "s"
    result = run_child(tiny_model, texts, store, crash_at="features_written:3")
    assert result.returncode == -signal.SIGKILL
    problems = verify_store(store)
    assert problems and all("uncommitted" in p and "rerunning featurize" in p for p in problems)
    featurize_texts(FeaturizeConfig(model=tiny_model, **SETTINGS), texts, store)
    assert verify_store(store) == []
