"""The GPU path (`cli featurize` on a GPU box): features on CUDA, bf16 autocast (auto precision), equal
the CPU fp32 features within bf16 tolerance. Marked `gpu`; skipped where torch sees no CUDA device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headstore.data.text_id import text_ids
from headstore.featurize.config import FeaturizeConfig
from headstore.featurize.run import featurize_texts
from headstore.featurize.store import FeatureStore

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
