"""precision=bf16: close to the fp32 features but not the same computation, so the store's
fingerprint tells them apart and a store refuses to mix the two."""

from __future__ import annotations

import numpy as np
import pytest

from headstore.data.text_id import text_ids
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.encoder.resolved import resolve
from headstore.featurize.run.plan import Plan
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.layout import StoreError


def config(model, **kw) -> FeaturizeConfig:
    base = dict(model=model, dtype="float32", batch_tokens=128, commit_seconds=0, device="cpu")
    return FeaturizeConfig(**{**base, **kw})


def test_bf16_features_are_close_to_fp32_and_fingerprinted_apart(tiny_model, texts, tmp_path):
    featurize_texts(config(tiny_model, precision="fp32"), texts, tmp_path / "fp32")
    summary = featurize_texts(config(tiny_model, precision="bf16"), texts, tmp_path / "bf16")
    assert summary["precision"] == "bf16"
    fp32, bf16 = (FeatureStore.open(tmp_path / name) for name in ("fp32", "bf16"))
    a = fp32.features()[fp32.rows_for(text_ids(texts))]
    b = bf16.features()[bf16.rows_for(text_ids(texts))]
    diff = np.abs(a - b).max()
    assert 0 < diff < 0.1 * np.abs(a).max()  # bf16 keeps ~3 significant digits
    assert fp32.manifest["precision"] == "fp32" and bf16.manifest["precision"] == "bf16"
    assert fp32.fingerprint != bf16.fingerprint
    with pytest.raises(StoreError, match="precision: store has 'fp32', this run has 'bf16'"):
        featurize_texts(config(tiny_model, precision="bf16"), texts + ["one more"], tmp_path / "fp32")


def test_auto_precision_is_fp32_on_cpu_and_bad_values_are_refused(tiny_model):
    assert resolve(config(tiny_model)).parts()["precision"] == "fp32"
    assert resolve(config(tiny_model), "cuda").precision == "bf16"
    with pytest.raises(ValueError, match=r"\['auto', 'fp32', 'bf16', 'fp16', 'bf16-autocast', 'bf16-weights'\]"):
        config(tiny_model, precision="fp8")
    with pytest.raises(ValueError, match="precision fp16 needs --device cuda"):
        resolve(config(tiny_model, precision="fp16"))


def test_bf16_weights_and_bf16_autocast_stores_are_never_mixed(tiny_model, texts, tmp_path):
    """On cuda bf16 (and auto) hold the weights in bf16: a `numerics` part that stores of bf16 autocast (on
    CPU, or --precision bf16-autocast on cuda) lack, so each refuses the other's rows; fp32 gets no part."""
    assert "numerics" not in resolve(config(tiny_model, precision="fp32"), "cuda").parts()
    assert resolve(config(tiny_model), "cuda").parts()["numerics"] == "bf16-weights"
    assert resolve(config(tiny_model, precision="fp16"), "cuda").parts()["numerics"] == "fp16-weights"
    autocast = resolve(config(tiny_model, precision="bf16-autocast"), "cuda").parts()
    assert "numerics" not in autocast and autocast == resolve(config(tiny_model, precision="bf16"), "cpu").parts()
    featurize_texts(config(tiny_model, precision="bf16"), texts[:5], tmp_path / "autocast")  # CPU: autocast
    with pytest.raises(StoreError, match="numerics: store has None, this run has 'bf16-weights'"):
        Plan.make(config(tiny_model, precision="bf16"), tmp_path / "autocast", device="cuda")
