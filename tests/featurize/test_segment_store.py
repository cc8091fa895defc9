"""Format 2: commits append parts, row subsets read, plain readers, format-1 stores read and migrated,
compaction, windows, the id sets."""

from __future__ import annotations

import json
import random

import numpy as np
import polars as pl
import pytest
import zarr
from click.testing import CliRunner

import headstore.featurize.store.maintain as maintain
from headstore.cli import main
from headstore.data.dataset import load_dataset
from headstore.data.text_id import text_ids
from headstore.featurize.store.ids import IdSet, SortedIds, keys_of_hex
from headstore.featurize.run.local import featurize, featurize_texts
from headstore.featurize.run.source import open_sources
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.layout import StoreError
from headstore.featurize.store.verify import verify_store

from featurize_helpers import random_texts
from store_helpers import config, make_format1_copy


def test_a_commit_writes_a_new_part_and_leaves_old_ones_untouched(tiny_model, texts, tmp_path):
    store = tmp_path / "s"
    featurize_texts(config(tiny_model, commit_seconds=3600, shard_rows=64), texts[:30], store)
    (first,) = (store / "texts").glob("part-*.parquet")
    before = (first.read_bytes(), first.stat().st_mtime_ns)
    featurize_texts(config(tiny_model, commit_seconds=3600, shard_rows=64), texts, store)
    parts = sorted((store / "texts").glob("part-*.parquet"))
    assert [p.name for p in parts] == ["part-000000.parquet", "part-000001.parquet"]
    assert (first.read_bytes(), first.stat().st_mtime_ns) == before
    # plain polars over the glob and plain zarr read the store
    table = pl.scan_parquet(str(store / "texts" / "*.parquet")).collect()
    assert sorted(table["row"].to_list()) == list(range(60))
    plain = zarr.open_array(store / "features.zarr", mode="r")[:]
    opened = FeatureStore.open(store)
    np.testing.assert_array_equal(plain, opened.features())
    manifest = json.loads((store / "manifest.json").read_text())
    assert manifest["format_version"] == 2 and manifest["n_texts"] == 60
    assert [p["n_rows"] for p in manifest["parts"]] == [30, 30]


def test_features_of_some_rows(tiny_model, texts, tmp_path):
    featurize_texts(config(tiny_model), texts, tmp_path / "s")
    store = FeatureStore.open(tmp_path / "s")
    full = store.features()
    rows = [17, 3, 3, 59, 0]
    np.testing.assert_array_equal(store.features(rows), full[rows])
    np.testing.assert_array_equal(store.features(rows=[], array="features"), full[[]])
    with pytest.raises(IndexError, match="row 60 out of range"):
        store.features([60])


def test_windows_resume_and_dedup_across_windows(tiny_model, tmp_path):
    many = random_texts(90, seed=5)
    stream = many[:50] + many[:10] + many[50:]  # duplicates that fall into later windows
    summary = featurize_texts(config(tiny_model, window_texts=16), stream, tmp_path / "s")
    assert summary["n_windows"] == 7 and summary["n_encoded"] == 90 == summary["n_texts"]
    store = FeatureStore.open(tmp_path / "s")
    one = featurize_texts(config(tiny_model, window_texts=1000), many, tmp_path / "one")
    assert one["n_windows"] == 1
    other = FeatureStore.open(tmp_path / "one")
    ids = text_ids(many)
    np.testing.assert_allclose(store.features(store.rows_for(ids)), other.features(other.rows_for(ids)),
                               atol=1e-6)
    assert verify_store(tmp_path / "s") == []


def test_streamed_sources_equal_load_dataset(tmp_path):
    txt = tmp_path / "a.txt"
    txt.write_bytes("\ufeffone cat\r\n\n  two dogs  \nthree\n\n\nfour\none cat\n".encode())
    frame = pl.DataFrame({"text": ["x", " ", "y", "x", "z  "], "split": ["train"] * 5})
    frame.write_parquet(tmp_path / "b.parquet")
    for path in (txt, tmp_path / "b.parquet"):
        (source,) = open_sources([path], None)
        streamed = [t for _, chunk in source.chunks(chunk_rows=2) for t in chunk]
        assert list(dict.fromkeys(streamed)) == load_dataset(path).texts()


def test_id_set_against_a_python_set():
    rng = random.Random(0)
    keys = np.array([[rng.getrandbits(64), rng.getrandbits(64)] for _ in range(3000)], dtype=np.uint64)
    keys[100:110, 0] = keys[99, 0]  # equal high words, different low words
    ids = IdSet()
    for start in range(0, 2000, 137):
        ids.add(keys[start:min(start + 137, 2000)])
    reference = {tuple(k) for k in keys[:2000].tolist()}
    got = ids.contains(keys)
    assert got.tolist() == [tuple(k) in reference for k in keys.tolist()]
    assert len(ids.runs) < 8  # runs were merged
    run = SortedIds(keys[:50], np.arange(50))
    assert run.values[run.find(keys[[7, 3]])].tolist() == [7, 3]
    assert keys_of_hex(["00" * 15 + "01"]).tolist() == [[0, 1]]


@pytest.fixture
def format1(tiny_model, texts, tmp_path):
    featurize_texts(config(tiny_model, layers=(-1, -2)), texts[:40], tmp_path / "v2")
    make_format1_copy(tmp_path / "v2", tmp_path / "v1")
    return tmp_path / "v1"


def test_format1_is_read_refused_for_writing_then_migrated(tiny_model, texts, tmp_path, format1):
    new = FeatureStore.open(tmp_path / "v2")
    old = FeatureStore.open(format1)
    assert old.format_version == 1 and old.n_texts == 40
    ids = text_ids(texts[:40])
    for name in new.arrays:
        np.testing.assert_array_equal(old.features(old.rows_for(ids), name),
                                      new.features(new.rows_for(ids), name))
    assert verify_store(format1) == []
    with pytest.raises(StoreError, match="store migrate"):
        featurize_texts(config(tiny_model, layers=(-1, -2)), texts, format1)
    result = CliRunner().invoke(main, ["store", "migrate", str(format1)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["migrated"] is True
    assert verify_store(format1) == [] and not (format1 / "texts.parquet").exists()
    migrated = FeatureStore.open(format1)
    assert migrated.format_version == 2 and migrated.fingerprint == new.fingerprint
    for name in new.arrays:
        np.testing.assert_array_equal(migrated.features(migrated.rows_for(ids), name),
                                      new.features(new.rows_for(ids), name))
    summary = featurize_texts(config(tiny_model, layers=(-1, -2)), texts, format1)
    assert summary["n_encoded"] == 20 and verify_store(format1) == []
    again = CliRunner().invoke(main, ["store", "migrate", str(format1)])
    assert again.exit_code == 0 and json.loads(again.output)["migrated"] is False


def test_migrate_killed_during_the_swap_is_finished_by_a_rerun(format1, monkeypatch):
    real_rename = maintain.os.rename
    calls = {"n": 0}

    def dying_rename(src, dst):
        calls["n"] += 1
        if calls["n"] == 3:  # staged, then one array moved aside: die mid-swap
            raise KeyboardInterrupt
        return real_rename(src, dst)

    monkeypatch.setattr(maintain.os, "rename", dying_rename)
    with pytest.raises(KeyboardInterrupt):
        maintain.migrate_store(format1)
    monkeypatch.setattr(maintain.os, "rename", real_rename)
    assert (format1 / ".migrate.ready").exists()
    assert maintain.migrate_store(format1)["migrated"] is True
    assert verify_store(format1) == [] and FeatureStore.open(format1).n_texts == 40


def test_compact_merges_parts(tiny_model, texts, tmp_path):
    store = tmp_path / "s"
    featurize_texts(config(tiny_model), texts, store)  # commit_seconds=0: a part per batch
    before = FeatureStore.open(store)
    before_texts, before_features = before.texts, before.features()
    n_parts = len(before.part_files())
    assert n_parts > 3
    result = CliRunner().invoke(main, ["store", "compact", str(store), "--target-rows", "25"])
    assert result.exit_code == 0, result.output
    after = FeatureStore.open(store)
    assert len(after.part_files()) == json.loads(result.output)["parts_after"] < n_parts
    assert after.texts.equals(before_texts)
    np.testing.assert_array_equal(after.features(), before_features)
    assert verify_store(store) == [] and len(list((store / "texts").iterdir())) == len(after.part_files())


def test_featurize_from_files_streams_them(tiny_model, texts, tmp_path):
    (tmp_path / "a.txt").write_text("\n".join(texts[:30]) + "\n\n")
    pl.DataFrame({"body": texts[20:]}).write_parquet(tmp_path / "b.parquet")
    summary = featurize(config(tiny_model, window_texts=7), [tmp_path / "a.txt", tmp_path / "b.parquet"],
                        tmp_path / "s", ["text"])
    assert summary["n_input_texts"] == 70 and summary["n_unique"] == 60 == summary["n_texts"]
    assert sorted(FeatureStore.open(tmp_path / "s").texts["text_id"]) == sorted(text_ids(texts))
