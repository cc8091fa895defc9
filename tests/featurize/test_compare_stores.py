"""bench/parity/compare_stores.py (the GPU check's store-vs-reference bound): rows joined by text_id, unit rows compared."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from featurize_helpers import random_texts

from headstore.data.text_id import text_ids
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.reader import FeatureStore

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "parity"))
from compare_stores import compare  # noqa: E402


def _unit(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _write_ref(path: Path, ids: list[str], feats: np.ndarray) -> None:
    column = pa.FixedSizeListArray.from_arrays(pa.array(feats.reshape(-1), pa.float32()), feats.shape[1])
    pq.write_table(pa.table({"text_id": ids, "features": column}), path)


def test_stores_and_reference_joined_by_text_id(tiny_model, tmp_path):
    texts = random_texts(30, seed=3)
    fp32 = FeaturizeConfig(model=tiny_model, dtype="float32", precision="fp32", device="cpu")
    featurize_texts(fp32, texts, tmp_path / "a")
    featurize_texts(FeaturizeConfig(model=tiny_model, dtype="float16", precision="fp32", device="cpu"),
                    texts[10:][::-1], tmp_path / "b")  # a subset, stored in another row order
    a, b = FeatureStore.open(tmp_path / "a"), FeatureStore.open(tmp_path / "b")
    shared = text_ids(texts[10:])
    expected = np.abs(_unit(a.features()[a.rows_for(shared)]) - _unit(b.features()[b.rows_for(shared)])).max()

    result = compare(tmp_path / "a", tmp_path / "b")
    assert (result["n_a"], result["n_b"], result["n_compared"]) == (30, 20, 20)
    assert 0 < result["max_abs_diff"] < 1e-2  # float16 storage rounding, nothing else
    assert np.isclose(result["max_abs_diff"], expected, rtol=1e-6)

    # a reference file in reversed order with one row moved: the max is that row's change, by text_id
    ids = text_ids(texts)[::-1]
    feats = a.features()[a.rows_for(ids)].astype(np.float32)
    feats[4] += 0.05
    _write_ref(tmp_path / "ref.parquet", ids, feats)
    moved = np.abs(_unit(feats[4:5]) - _unit(a.features()[a.rows_for(ids[4:5])])).max()
    result = compare(tmp_path / "ref.parquet", tmp_path / "a")
    assert result["n_compared"] == 30
    assert np.isclose(result["max_abs_diff"], moved, rtol=1e-5)

    _write_ref(tmp_path / "other.parquet", ["0" * 32], feats[:1])
    assert compare(tmp_path / "other.parquet", tmp_path / "a")["n_compared"] == 0
