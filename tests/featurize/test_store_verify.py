"""`store verify` catches each kind of corruption; `store info` summarises."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import zarr

from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.verify import store_info, verify_store


@pytest.fixture
def store(tiny_model, texts, tmp_path):
    path = tmp_path / "s"
    featurize_texts(FeaturizeConfig(model=tiny_model, batch_tokens=128, chunk_rows=4, shard_rows=16,
                                    device="cpu"), texts[:20], path)
    assert verify_store(path) == []
    return path


def part_of(path):
    (part,) = (path / "texts").glob("part-*.parquet")
    return part


def rewrite_texts(path, fn):
    table = pl.read_parquet(part_of(path))
    fn(table).write_parquet(part_of(path))


def test_nan_in_features(store):
    arr = zarr.open_array(store / "features.zarr", mode="r+")
    arr[7, 3] = np.nan
    (problem,) = verify_store(store)
    assert "NaN/inf" in problem and "row 7" in problem


def test_duplicated_row(store):
    rewrite_texts(store, lambda t: t.with_columns(
        pl.when(pl.col("row") == 3).then(2).otherwise(pl.col("row")).alias("row")))
    assert any("duplicated or missing rows" in p for p in verify_store(store))


def test_text_id_not_hash_of_text(store):
    rewrite_texts(store, lambda t: t.with_columns(
        pl.when(pl.col("row") == 5).then(pl.lit("changed")).otherwise(pl.col("text")).alias("text")))
    assert any("do not match hash(text)" in p and "row 5" in p for p in verify_store(store))


def test_duplicated_text_id(store):
    rewrite_texts(store, lambda t: t.with_columns(
        pl.when(pl.col("row") == 1).then(pl.lit(t["text_id"][0])).otherwise(pl.col("text_id")).alias("text_id")))
    assert any("duplicated text_id" in p for p in verify_store(store))


def test_edited_manifest_part(store):
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["pooling"] = "max"
    (store / "manifest.json").write_text(json.dumps(manifest))
    assert any("fingerprint does not match" in p for p in verify_store(store))


def test_array_shape_and_n_texts(store):
    zarr.open_array(store / "features.zarr", mode="r+").resize((25, 32))
    assert any("rows 20..24 are uncommitted" in p and "rerunning featurize" in p
               for p in verify_store(store))
    rewrite_texts(store, lambda t: t.filter(pl.col("row") < 19))
    assert any("19 rows, the manifest says 20" in p for p in verify_store(store))


def test_missing_shard_file_and_garbage(store):
    shard = next(p for p in (store / "features.zarr" / "c").rglob("*") if p.is_file())
    shard.write_bytes(b"garbage")
    assert any("cannot read data" in p for p in verify_store(store))


def test_not_a_store(tmp_path):
    assert "no manifest.json" in verify_store(tmp_path)[0]


def test_info(store):
    info = store_info(store)
    assert info["n_texts"] == 20 and info["dim"] == 32 and info["dtype"] == "float16"
    assert info["arrays"] == {"features": "features.zarr"}
    assert info["n_truncated"] == int(pl.read_parquet(part_of(store))["truncated"].sum())
    assert info["size_bytes"] > 20 * 32 * 2
