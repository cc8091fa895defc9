"""headstore.Store / Head / Pipeline on a tiny world: row subsets, lookups, the encode round trip, refusals."""
import subprocess
import sys

import numpy as np
import pytest
import torch

import headstore
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.run.local import featurize
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.scoring.energy import l1_energy

from .finetune_world import tiny_bert


def test_import_headstore_is_light_and_exports_the_api():
    code = ("import sys, headstore; lazy = 'torch' not in sys.modules; import headstore.cli; "
            "heavy = 'sentence_transformers' in sys.modules or 'faiss' in sys.modules; "
            "print(lazy, heavy, headstore.Store.__name__, headstore.Head.__name__, headstore.Pipeline.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False", "Store", "Head", "Pipeline"]
    assert {"Store", "Head", "Pipeline"} <= set(dir(headstore))


def test_store_reads_only_the_rows_asked_for(world, monkeypatch):
    store = headstore.Store.open(world.store)
    full = FeatureStore.open(world.store).features()
    rows = np.array([7, 3, 7, 0, len(store) - 1])
    monkeypatch.setattr(FeatureStore, "features", lambda *a, **k: pytest.fail("read the whole array"))
    np.testing.assert_array_equal(store.features(rows), full[rows])
    assert store.features([]).shape == (0, store.dim)
    with pytest.raises(IndexError, match="out of range"):
        store.features([len(store)])


def test_store_rows_for_texts_and_ids(world):
    store = headstore.Store.open(world.store)
    texts = store.texts["text"].to_list()[:5][::-1]
    ids = store.texts["text_id"].to_list()[:5][::-1]
    np.testing.assert_array_equal(store.rows_for(texts), [4, 3, 2, 1, 0])
    np.testing.assert_array_equal(store.rows_for(ids), [4, 3, 2, 1, 0])
    np.testing.assert_array_equal(store.rows_for([texts[0], ids[1]]), [4, 3])
    with pytest.raises(KeyError, match="not in the store.*never featurized"):
        store.rows_for([texts[0], "never featurized"])
    assert store.fingerprint == FeatureStore.open(world.store).fingerprint


def test_head_embed_and_energy_match_the_head_maths(world):
    head = headstore.Head.load(world.head)
    store = headstore.Store.open(world.store)
    X = store.features(np.arange(12))
    z = head.embed(X)
    ref = head.model(head.normalizer(torch.from_numpy(X)))[0].detach().numpy()
    np.testing.assert_allclose(z, ref, rtol=0, atol=1e-6)
    E = head.energy(X[:3], X[3:12])
    loop = [[float(l1_energy(torch.from_numpy(z[i]), torch.from_numpy(z[j]))) for j in range(3, 12)] for i in range(3)]
    np.testing.assert_allclose(E, loop, rtol=1e-5)
    assert head.store_fingerprint == store.fingerprint and head.energy_name == "l1"


@pytest.mark.parametrize("batch_size", [1, 7, 64])
def test_pipeline_encode_equals_the_head_on_stored_features(world, batch_size):
    """The round trip: new texts through Pipeline == the head applied to the stored features of those texts."""
    store, head = headstore.Store.open(world.store), headstore.Head.load(world.head)
    texts = store.texts["text"].to_list()[::3]
    pipe = headstore.Pipeline.from_head(head)
    got = pipe.encode(texts, batch_size=batch_size)
    want = head.embed(store.features(store.rows_for(texts)))
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(pipe.score(texts[:4], texts), head.energy(store.features(store.rows_for(texts[:4])),
                                                                          store.features(store.rows_for(texts))),
                               rtol=1e-4, atol=1e-5)


def test_pipeline_on_a_float16_store_rounds_as_the_store_did(world, tmp_path):
    store16 = tmp_path / "store16"
    featurize(FeaturizeConfig(model=str(world.model), dtype="float16", batch_tokens=2048), [str(world.beir)], store16)
    from headstore.heads.settings.config import TrainConfig
    from headstore.heads.settings.config import HeadConfig
    from headstore.heads.training.run import train_head

    train_head(str(store16), str(world.beir), str(tmp_path / "h16"), HeadConfig(hidden=16),
               TrainConfig(epochs=1, batch_size=8, mined_k=0), progress=False)
    store, pipe = headstore.Store.open(store16), headstore.Pipeline.from_head(str(tmp_path / "h16"))
    texts = store.texts["text"].to_list()[:20]
    stored = store.features(store.rows_for(texts))
    got = pipe.features(texts, batch_size=5)
    assert np.array_equal(got, got.astype(np.float16).astype(np.float32))  # float16 values, as stored
    np.testing.assert_allclose(got, stored, rtol=0, atol=2e-3)  # at most an ulp where batch rounding tips it


def test_pipeline_refuses_another_encoder(world, tmp_path):
    other = tiny_bert(tmp_path / "other", layers=2)
    from safetensors.torch import load_file, save_file

    weights = load_file(str(other / "model.safetensors"))
    key = next(k for k in weights if k.endswith("word_embeddings.weight"))
    weights[key] = weights[key] + 0.01  # the same architecture and tokenizer, other weights
    save_file(weights, str(other / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="weights_hash"):
        headstore.Pipeline.from_head(headstore.Head.load(world.head), model=str(other))


def test_head_load_errors_are_clear(world, tmp_path):
    with pytest.raises(FileNotFoundError, match="train-head"):
        headstore.Head.load(tmp_path)
    with pytest.raises(ValueError, match="list of texts"):
        headstore.Pipeline.from_head(str(world.head)).encode("one string")
