"""Helpers for store tests: a format-1 copy of a store, and a small featurize config."""

from __future__ import annotations

import json
import shutil

import polars as pl
import zarr

from headstore.featurize.encoder.config import FeaturizeConfig


def config(model, **kw) -> FeaturizeConfig:
    base = dict(model=model, dtype="float32", batch_tokens=128, commit_seconds=0, chunk_rows=4,
                shard_rows=16, device="cpu")
    return FeaturizeConfig(**{**base, **kw})


def make_format1_copy(store, target) -> None:
    """Write `target` as the format-1 layout the older headstore wrote: texts.parquet, a manifest
    without format_version/parts, arrays without checksums."""
    target.mkdir(parents=True)
    manifest = json.loads((store / "manifest.json").read_text())
    texts = pl.read_parquet(store / "texts" / "*.parquet").sort("row")
    texts.write_parquet(target / "texts.parquet")
    for spec in manifest["arrays"].values():
        old = zarr.open_array(store / spec["path"], mode="r")
        new = zarr.create_array(store=str(target / spec["path"]), shape=old.shape, dtype=old.dtype,
                                chunks=old.chunks, shards=old.shards, compressors=None,
                                fill_value=0, zarr_format=3)
        new[:] = old[:]
    legacy = {k: v for k, v in manifest.items()
              if k not in ("format_version", "parts", "next_part", "chunk_rows", "shard_rows")}
    (target / "manifest.json").write_text(json.dumps(legacy, indent=2))
    if (store / "config.json").exists():
        shutil.copy(store / "config.json", target / "config.json")
