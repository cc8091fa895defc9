"""Store round trip, plain-library readability, incremental adds, refusals."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import polars as pl
import pytest
import torch
import zarr
from transformers import AutoModel, AutoTokenizer

import headstore.featurize.run.windows as windows_run
from headstore.data.text_id import text_ids
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.layout import StoreError
from headstore.featurize.store.verify import verify_store

from featurize_helpers import random_texts


def config(model, **kw) -> FeaturizeConfig:
    base = dict(model=model, dtype="float32", batch_tokens=128, commit_seconds=0, chunk_rows=4,
                shard_rows=16, device="cpu")
    return FeaturizeConfig(**{**base, **kw})


def reference(model_dir, texts, layer=-1, pooling="mean") -> np.ndarray:
    """Plain transformers, one text at a time, no padding at all."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    out = []
    with torch.no_grad():
        for text in texts:
            enc = tok([text], return_tensors="pt", truncation=True)
            hidden = model(**enc, output_hidden_states=True).hidden_states[layer][0]  # (S, D)
            out.append({"mean": hidden.mean(0), "cls": hidden[0], "max": hidden.max(0).values}[pooling])
    return torch.stack(out).numpy()


def test_round_trip_matches_reference_and_plain_readers(tiny_model, texts, tmp_path):
    summary = featurize_texts(config(tiny_model, layers=(-1, -2)), texts, tmp_path / "s")
    assert summary["n_encoded"] == len(texts) == summary["n_texts"]
    store = FeatureStore.open(tmp_path / "s")
    got = store.features()[store.rows_for(text_ids(texts))]
    np.testing.assert_allclose(got, reference(tiny_model, texts), atol=1e-5)
    got2 = store.features("features_layer-2")[store.rows_for(text_ids(texts))]
    np.testing.assert_allclose(got2, reference(tiny_model, texts, layer=-2), atol=1e-5)
    # plain zarr + polars, no headstore code
    table = pl.read_parquet(tmp_path / "s" / "texts" / "*.parquet")
    plain = zarr.open_array(tmp_path / "s" / "features.zarr", mode="r")[:]
    assert plain.shape == (len(texts), 32) and plain.dtype == np.float32
    by_id = dict(zip(table["text_id"], table["row"]))
    np.testing.assert_array_equal(plain[[by_id[t] for t in text_ids(texts)]], got)
    assert sorted(table["row"]) == list(range(len(texts)))
    # truncation is recorded: tiny model max length is 24 tokens
    n_tok = [len(AutoTokenizer.from_pretrained(tiny_model)(t)["input_ids"]) for t in texts]
    expected_trunc = {tid: n > 24 for tid, n in zip(text_ids(texts), n_tok)}
    assert dict(zip(table["text_id"], table["truncated"])) == expected_trunc
    assert any(expected_trunc.values()) and summary["n_truncated"] == sum(expected_trunc.values())
    assert verify_store(tmp_path / "s") == []


@pytest.mark.parametrize("pooling", ["cls", "max"])
def test_other_poolings_match_reference(tiny_model, texts, tmp_path, pooling):
    featurize_texts(config(tiny_model, pooling=pooling), texts[:20], tmp_path / "s")
    store = FeatureStore.open(tmp_path / "s")
    got = store.features()[store.rows_for(text_ids(texts[:20]))]
    np.testing.assert_allclose(got, reference(tiny_model, texts[:20], pooling=pooling), atol=1e-5)


def test_float16_store(tiny_model, texts, tmp_path):
    featurize_texts(config(tiny_model, dtype="float16"), texts, tmp_path / "s")
    store = FeatureStore.open(tmp_path / "s")
    assert store.array().dtype == np.float16
    got = store.features()[store.rows_for(text_ids(texts))]
    np.testing.assert_allclose(got, reference(tiny_model, texts), atol=2e-3, rtol=2e-3)


def test_incremental_encodes_only_new_texts(tiny_model, texts, tmp_path, monkeypatch):
    encoded = []
    real = windows_run.encode_batch

    def counting(encoder, batch, *a, **kw):
        encoded.append(batch.input_ids.shape[0])
        return real(encoder, batch, *a, **kw)

    monkeypatch.setattr(windows_run, "encode_batch", counting)
    featurize_texts(config(tiny_model), texts[:40], tmp_path / "s")
    assert sum(encoded) == 40
    encoded.clear()
    summary = featurize_texts(config(tiny_model), texts[20:] + texts[:5], tmp_path / "s")
    assert sum(encoded) == 20 and summary["n_encoded"] == 20
    assert summary["n_already_stored"] == 25 and summary["n_texts"] == 60
    store = FeatureStore.open(tmp_path / "s")
    np.testing.assert_allclose(store.features()[store.rows_for(text_ids(texts))],
                               reference(tiny_model, texts), atol=1e-5)
    assert verify_store(tmp_path / "s") == []


def test_duplicates_are_encoded_once(tiny_model, tmp_path):
    summary = featurize_texts(config(tiny_model), ["one cat", "two dogs", "one cat"], tmp_path / "s")
    assert summary["n_unique"] == 2 and FeatureStore.open(tmp_path / "s").n_texts == 2


def test_rerun_with_nothing_new_does_not_load_the_model(tiny_model, texts, tmp_path, monkeypatch):
    featurize_texts(config(tiny_model), texts, tmp_path / "s")

    def fail(*a, **kw):
        raise AssertionError("model loaded on a no-op run")

    monkeypatch.setattr(windows_run, "open_model", fail)
    summary = featurize_texts(config(tiny_model), texts, tmp_path / "s")
    assert summary["n_encoded"] == 0 and summary["n_texts"] == len(texts)


def test_fingerprint_mismatch_is_refused_naming_the_parts(tiny_model, texts, tmp_path):
    featurize_texts(config(tiny_model), texts[:10], tmp_path / "s")
    before = (tmp_path / "s" / "manifest.json").read_bytes()
    with pytest.raises(StoreError, match="pooling: store has 'mean', this run has 'max'"):
        featurize_texts(config(tiny_model, pooling="max"), texts, tmp_path / "s")
    with pytest.raises(StoreError, match="dtype") as err:
        featurize_texts(config(tiny_model, dtype="float16", max_length=16), texts, tmp_path / "s")
    assert "max_length" in str(err.value)
    assert (tmp_path / "s" / "manifest.json").read_bytes() == before


def test_other_weights_are_refused(tiny_model, texts, tmp_path, tmp_path_factory):
    from featurize_helpers import build_tiny_bert

    other = build_tiny_bert(tmp_path / "tiny-bert", seed=1)  # same name, other weights
    featurize_texts(config(tiny_model), texts[:5], tmp_path / "s")
    with pytest.raises(StoreError, match="weights_hash"):
        featurize_texts(config(other), texts[:5], tmp_path / "s")


def test_second_writer_is_refused(tiny_model, texts, tmp_path):
    featurize_texts(config(tiny_model), texts[:5], tmp_path / "s")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from filelock import FileLock
        lock = FileLock({str(tmp_path / "s" / ".lock")!r}, timeout=0); lock.acquire()
        print("locked", flush=True); time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StoreError, match="another process is writing"):
            featurize_texts(config(tiny_model), texts, tmp_path / "s")
    finally:
        holder.kill()
        holder.wait()
    # the OS released the dead holder's lock: writing works again
    assert featurize_texts(config(tiny_model), texts, tmp_path / "s")["n_texts"] == len(texts)


def test_refuses_a_directory_that_is_not_a_store(tiny_model, tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="not a feature store"):
        featurize_texts(config(tiny_model), ["one cat"], tmp_path / "s")


def test_rows_for_names_a_missing_text(tiny_model, tmp_path):
    featurize_texts(config(tiny_model), ["one cat"], tmp_path / "s")
    with pytest.raises(KeyError, match="not in the store"):
        FeatureStore.open(tmp_path / "s").rows_for(text_ids(["two dogs"]))


def test_bad_layer_is_a_value_error(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="layer 7 out of range"):
        featurize_texts(config(tiny_model, layers=(7,)), ["one cat"], tmp_path / "s")


def test_many_texts_cross_shards(tiny_model, tmp_path):
    many = random_texts(150, seed=3)
    featurize_texts(config(tiny_model, batch_tokens=256), many[:70], tmp_path / "s")
    featurize_texts(config(tiny_model, batch_tokens=256), many, tmp_path / "s")
    store = FeatureStore.open(tmp_path / "s")
    np.testing.assert_allclose(store.features()[store.rows_for(text_ids(many))],
                               reference(tiny_model, many), atol=1e-5)
    assert verify_store(tmp_path / "s") == []
