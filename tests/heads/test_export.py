"""cli export --format sentence-transformers: plain SentenceTransformer(DIR) (no trust_remote_code) encodes
as Pipeline.encode does, for every head shape with an exact stock form, and ranks as the energy does."""
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import headstore
from headstore.cli import main
from headstore.heads.apply.export import export_head
from headstore.heads.settings.config import HeadConfig

SHAPES = {  # name: (HeadConfig, normalize, training settings)
    "residual-gelu-2": (HeadConfig(hidden=16), "l2", {}),
    "residual-relu-3": (HeadConfig(hidden=16, depth=3, activation="relu"), "standardize", {}),
    "residual-identity-2": (HeadConfig(hidden=16, activation="identity"), "center-l2", {}),
    "residual-1": (HeadConfig(depth=1), "center", {}),
    "plain-layernorm-tanh-3": (HeadConfig(hidden=16, depth=3, out_dim=8, residual=False, layer_norm=True,
                                          activation="tanh"), "l2", {"loss": "mnr"}),
    "l2-energy": (HeadConfig(hidden=16), "none", {"energy": "l2"}),
}
SIMILARITY = {"l1": "manhattan", "l2": "euclidean", "cosine": "cosine"}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_sentence_transformers_export_encodes_like_the_pipeline(world, tmp_path, name):
    from sentence_transformers import SentenceTransformer

    head_cfg, normalize, train = SHAPES[name]
    head_dir = world.random_head(name, head_cfg, normalize, **train)
    out = tmp_path / "st"
    r = CliRunner().invoke(main, ["export", "--head", str(head_dir), "--format", "sentence-transformers", "--out", str(out)])
    assert r.exit_code == 0, r.output
    modules = json.loads((out / "modules.json").read_text())
    assert all(m["type"].startswith("sentence_transformers.") for m in modules)  # stock modules only
    model = SentenceTransformer(str(out), device="cpu")  # trust_remote_code stays False
    head = headstore.Head.load(head_dir)
    acts = {type(m.activation_function).__name__ for m in model if type(m).__name__ == "Dense"}
    assert acts <= {"Identity", {"gelu": "GELU", "relu": "ReLU", "tanh": "Tanh", "identity": "Identity"}[head_cfg.activation]}
    texts = headstore.Store.open(world.store).texts["text"].to_list()[:40]
    got = model.encode(texts, batch_size=16, convert_to_numpy=True)
    want = headstore.Pipeline.from_head(head).encode(texts)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert model.similarity_fn_name == SIMILARITY[head.energy_name]
    sim = model.similarity(got[:5], got).numpy()
    energy = headstore.Pipeline.from_head(head).score(texts[:5], texts)
    for i in range(5):
        np.testing.assert_array_equal(np.argsort(-sim[i], kind="stable")[:10], np.argsort(energy[i], kind="stable")[:10])
    if head.energy_name != "cosine":  # L2 via cdist's matmul expansion is off by ~sqrt(eps) near 0 on both sides
        np.testing.assert_allclose(sim, -energy, rtol=1e-4, atol=1e-4 if head.energy_name == "l1" else 5e-3)


@pytest.mark.parametrize("head_cfg, error", [
    (HeadConfig(hidden=16, activation="tanh"), "activation 'tanh'"),
    (HeadConfig(hidden=16, layer_norm=True), "layer norm"),
])
def test_heads_without_an_exact_stock_form_are_refused(world, tmp_path, head_cfg, error):
    head_dir = world.random_head("refused", head_cfg)
    with pytest.raises(ValueError, match=error):
        export_head(str(head_dir), "sentence-transformers", tmp_path / "st")
    assert not (tmp_path / "st").exists()  # issue 54, item 13: a refused export leaves nothing (no .headstore-partial)
    (tmp_path / "empty").mkdir()  # a folder the user made: left as it was, empty
    r = CliRunner().invoke(main, ["export", "--head", str(head_dir), "--format", "sentence-transformers", "--out",
                                  str(tmp_path / "empty")])
    assert r.exit_code == 2 and error in r.output and "Traceback" not in r.output, r.output
    assert list((tmp_path / "empty").iterdir()) == []


def test_export_refuses_a_non_empty_out_and_unknown_format(world, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    r = CliRunner().invoke(main, ["export", "--head", str(world.head), "--format", "safetensors", "--out", str(tmp_path / "full")])
    assert r.exit_code != 0 and "not an empty directory" in r.output
    r = CliRunner().invoke(main, ["export", "--head", str(world.head), "--format", "onnx", "--out", str(tmp_path / "o")])
    assert r.exit_code != 0 and "safetensors" in r.output and "sentence-transformers" in r.output
    r = CliRunner().invoke(main, ["export", "--format", "safetensors", "--out", str(tmp_path / "o")])
    assert r.exit_code != 0 and "--head" in r.output


def test_safetensors_export_is_a_head_dir(world, tmp_path):
    r = CliRunner().invoke(main, ["export", "--head", str(world.head), "--format", "safetensors", "--out", str(tmp_path / "h")])
    assert r.exit_code == 0, r.output
    assert {p.name for p in (tmp_path / "h").iterdir()} == {"head.safetensors", "normalizer.safetensors", "config.json",
                                                           "judgements.parquet"}  # the training judgements kept
    x = torch.randn(4, headstore.Head.load(world.head).in_dim)
    np.testing.assert_array_equal(headstore.Head.load(tmp_path / "h").embed(x), headstore.Head.load(world.head).embed(x))
