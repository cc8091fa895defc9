"""The taps fusion study (bench/studies/taps_fusion.py) and its same-width residual prototype
(bench/studies/taps_samewidth.py): dev's constants put every split on one scale; the weight search finds a planted
mix; the TF-IDF channel is the cosine of the two texts' TF-IDF vectors; a residual head over same-width arrays side
by side adds back its first array, and the product still refuses it without the prototype."""
from __future__ import annotations

import sys
from pathlib import Path

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from headstore.heads.network import model
from headstore.heads.settings.config import HeadConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies"))
taps_fusion = pytest.importorskip("taps_fusion")
taps_samewidth = pytest.importorskip("taps_samewidth")


def test_z_and_rank_put_every_split_on_devs_scale_unit_by_unit():
    rng = np.random.default_rng(0)
    dev, test = rng.normal(3, 2, (2, 50)), rng.normal(5, 1, (2, 20))
    z = taps_fusion.standardised({"dev": dev, "test": test}, "z")
    for u in range(2):  # the test's values are standardised by dev's mean and spread, not their own
        np.testing.assert_allclose(z["test"][u], (test[u] - dev[u].mean()) / dev[u].std())
    probe = np.stack([dev[0, :5], dev[1, :5]])  # values that are dev's own: their rank among dev's, + 1/2, over n
    r = taps_fusion.standardised({"dev": dev, "test": np.concatenate([probe, [[-99.0, 99.0]] * 2], 1)}, "rank")
    for u in range(2):
        want = [((dev[u] < v).sum() + 0.5) / 50 for v in probe[u]]
        np.testing.assert_allclose(r["test"][u, :5], want)
        assert r["test"][u, 5] == 0.5 / 50 and r["test"][u, 6] == 1 - 0.5 / 50  # outside dev's range: clipped
    with pytest.raises(ValueError, match="valid"):
        taps_fusion.standardised({"dev": dev}, "minmax")


def test_the_weight_search_finds_a_planted_mix_on_dev():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(2, 3000))
    gold = a + 0.5 * b  # the second channel is worth half the first
    parts = [{"dev": a[None]}, {"dev": b[None]}, {"dev": rng.normal(size=(1, 3000))}]  # the third is noise
    w, curve = taps_fusion.fit_weights(parts, gold)
    assert w[0] == 1.0 and w[1] == 0.5 and w[2] <= 0.1
    assert curve[w] == pytest.approx(spearmanr(a + 0.5 * b + w[2] * parts[2]["dev"][0], gold).statistic)


def test_the_tfidf_channel_is_the_cosine_of_the_texts_tfidf_vectors_idf_from_training_texts(monkeypatch):
    import polars as pl
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.metrics.pairwise import cosine_similarity

    import headstore.heads.kinds as kinds
    texts = ["a cat sat on the mat", "the cat sat", "dogs bark at night", "a dog barks", "night falls", "mat mat"]
    store = SimpleNamespace(texts=pl.DataFrame({"text": texts}))
    train = SimpleNamespace(anchor=np.array([0, 2]), positive=np.array([1, 0]))  # training texts: rows 0, 1, 2
    monkeypatch.setattr(kinds, "load_task", lambda data, st: SimpleNamespace(train=train))
    pairs = SimpleNamespace(anchor=np.array([0, 2, 4, 5]), positive=np.array([1, 3, 0, 0]))
    got = taps_fusion.tfidf_values(store, "DATA", pairs)
    vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True).fit(texts[:3])  # idf from training texts only
    want = np.diag(cosine_similarity(vec.transform([texts[r] for r in pairs.anchor]),
                                     vec.transform([texts[r] for r in pairs.positive])))
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert got[0] > 0.3 and got[2] == 0 and got[3] > 0  # shared words; none; "mat" (a training word) shared


def test_a_same_width_residual_head_adds_back_its_first_array_and_the_product_still_refuses_it(monkeypatch):
    cfg = HeadConfig(in_dim=8, mix=3, mix_mode="concat", out_dim=8, depth=1, hidden=16)  # residual by default
    with pytest.raises(ValueError, match="--no-residual"):
        model.StackedMLP(1, cfg)
    monkeypatch.setattr(model, "_check_buildable", taps_samewidth.same_width_residual(model._check_buildable))
    net = model.StackedMLP(1, cfg).eval()
    x = torch.randn(5, 24)
    torch.testing.assert_close(net(x)[0], x[:, :8])  # starts at the first array
    with torch.no_grad():
        net.weights[0].normal_()
        net.biases[0].normal_()
    torch.testing.assert_close(net(x)[0], x[:, :8] + x @ net.weights[0][0] + net.biases[0][0])
    with pytest.raises(ValueError, match="adds back the first array"):
        model.StackedMLP(1, HeadConfig(in_dim=8, mix=3, mix_mode="concat", out_dim=4, depth=1, hidden=16))
