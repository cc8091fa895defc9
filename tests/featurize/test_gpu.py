"""The GPU path (`cli featurize` on a GPU box): features on CUDA, weights held in bf16 (auto precision) and
packed batches (auto packing), equal the CPU fp32 features within bf16 tolerance; fp32 packed == padded; a
bf16-weights run never adds to a bf16-autocast store. Marked `gpu`; skipped where torch sees no CUDA device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headstore.data.text_id import text_ids
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.layout import StoreError

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_gpu_features_equal_cpu_fp32_within_bf16_tolerance(tiny_model, texts, tmp_path):
    base = dict(model=tiny_model, dtype="float32", commit_seconds=0)
    cpu = featurize_texts(FeaturizeConfig(**base, device="cpu", precision="fp32", batch_tokens=128), texts,
                          tmp_path / "cpu")
    gpu = featurize_texts(FeaturizeConfig(**base, device="cuda", batch_tokens=65536), texts, tmp_path / "gpu")
    assert cpu["precision"] == "fp32" and gpu["precision"] == "bf16" and gpu["device"] == "cuda"
    a, b = (FeatureStore.open(tmp_path / name) for name in ("cpu", "gpu"))
    fa, fb = a.features()[a.rows_for(text_ids(texts))], b.features()[b.rows_for(text_ids(texts))]
    scale = np.abs(fa).max()
    assert np.abs(fa - fb).max() < 0.05 * scale  # bf16 keeps ~3 significant digits over a few layers
    cos = (fa * fb).sum(1) / np.linalg.norm(fa, axis=1) / np.linalg.norm(fb, axis=1)
    assert cos.min() > 0.999


def _features(store_path, texts) -> np.ndarray:
    store = FeatureStore.open(store_path)
    return np.asarray(store.features()[store.rows_for(text_ids(texts))], dtype=np.float64)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_fp32_packed_equals_padded_on_cuda(tiny_model, texts, tmp_path):
    base = dict(model=tiny_model, dtype="float32", commit_seconds=0, device="cuda", precision="fp32",
                batch_tokens=65536)
    padded = featurize_texts(FeaturizeConfig(**base, packing="off"), texts, tmp_path / "padded")
    packed = featurize_texts(FeaturizeConfig(**base, packing="on"), texts, tmp_path / "packed")
    print("fp32 packed kernel:", packed["attention_kernel"], packed.get("packing_reason"))
    assert padded["packing"] == "off" and packed["packing"] == "on" and packed["padded_tokens"] == packed["real_tokens"]
    assert np.abs(_features(tmp_path / "packed", texts) - _features(tmp_path / "padded", texts)).max() <= 1e-5


def test_bf16_weights_packed_minilm_within_1e2_of_cpu_fp32(tmp_path):
    from headstore.featurize.encoder.model import resolve_model

    try:
        resolve_model("minilm")
    except ValueError:
        pytest.skip("needs the MiniLM weights (package or HEADSTORE_MINILM)")
    texts = [f"text {i}: " + " ".join(["the quick brown fox jumps over the lazy dog"] * (1 + i % 23))
             for i in range(300)]
    base = dict(model="minilm", dtype="float32", commit_seconds=0)
    featurize_texts(FeaturizeConfig(**base, device="cpu", precision="fp32"), texts, tmp_path / "cpu")
    gpu = featurize_texts(FeaturizeConfig(**base, device="cuda", batch_tokens=65536), texts, tmp_path / "gpu")
    print("bf16 summary:", {k: gpu[k] for k in ("numerics", "packing", "packing_reason", "attention_kernel")})
    assert gpu["numerics"] == "bf16-weights" and gpu["packing"] == "on", gpu.get("packing_reason")
    assert gpu["fingerprint"] != FeatureStore.open(tmp_path / "cpu").fingerprint
    diff = np.abs(_unit(_features(tmp_path / "gpu", texts)) - _unit(_features(tmp_path / "cpu", texts))).max()
    print("bf16-weights packed vs CPU fp32, max |diff| of unit rows:", diff)
    assert diff <= 1e-2


def test_bf16_weights_refuse_a_bf16_autocast_store_on_cuda(tiny_model, texts, tmp_path):
    base = dict(model=tiny_model, dtype="float32", commit_seconds=0, device="cuda", batch_tokens=65536)
    featurize_texts(FeaturizeConfig(**base, precision="bf16-autocast"), texts[:10], tmp_path / "store")
    with pytest.raises(StoreError, match="numerics: store has None, this run has 'bf16-weights'"):
        featurize_texts(FeaturizeConfig(**base, precision="bf16"), texts, tmp_path / "store")
