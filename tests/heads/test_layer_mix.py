"""Heads over several stored layers: a per-head softmax scalar mix of the layers as the head's input, or the layers
side by side (mix_mode concat)."""
import json

import numpy as np
import pytest
import torch

import headstore
from headstore.heads.network.features import Normalizer, read_features
from headstore.heads.network.model import MIX_GAIN, StackedMLP
from headstore.heads.settings.config import HeadConfig

from .conftest import FAST, assert_bad_input, cli


def test_mix_forward_equals_a_loop_reference():
    cfg = HeadConfig(depth=1, in_dim=4, mix=3, mix_init=0.6)
    model = StackedMLP(2, cfg, seeds=[0, 1])
    w0 = torch.softmax(MIX_GAIN * model.mix_logits, -1)
    assert w0[:, 0].tolist() == pytest.approx([0.6, 0.6]) and w0[:, 1].tolist() == pytest.approx([0.2, 0.2])
    with torch.no_grad():
        model.mix_logits.copy_(torch.randn(2, 3))
        model.weights[0].copy_(torch.randn(2, 4, 4))
    x = torch.randn(5, 12)  # 3 arrays of dim 4 side by side
    got = model(x)
    for h in range(2):
        w = torch.softmax(MIX_GAIN * model.mix_logits[h], -1)
        for i in range(5):
            mixed = sum(w[l] * x[i, 4 * l:4 * (l + 1)] for l in range(3))
            mixed = mixed / mixed.norm()
            want = mixed + mixed @ model.weights[0][h] + model.biases[0][h]  # the residual linear head
            torch.testing.assert_close(got[h, i], want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"\(B, 12\)"):
        model(torch.randn(5, 4))


def test_normalizer_l2_normalises_each_array():
    x = torch.randn(6, 8) * 3
    norm = Normalizer.fit("l2", x, blocks=2)
    y = norm(x)
    assert torch.allclose(y[:, :4].norm(dim=1), torch.ones(6)) and torch.allclose(y[:, 4:].norm(dim=1), torch.ones(6))


def two_layer_store(data_world, folder, data: str):
    """A float32 store of `data_world[data]` holding the last two layers (features, features_layer-2)."""
    store = folder / "store"
    r = cli("featurize", "--model", data_world["model"], "--data", data_world[data], "--layers", "-1,-2",
            "--store", store, "--dtype", "float32")
    assert r.exit_code == 0, r.output
    return store


@pytest.fixture(scope="module")
def layer_store(data_world, tmp_path_factory):
    return two_layer_store(data_world, tmp_path_factory.mktemp("layers"), "sts05")


def test_train_head_on_a_layer_mix(data_world, layer_store, tmp_path):
    w = data_world
    mixed, single = tmp_path / "mixed", tmp_path / "single"
    r = cli("train-head", "--store", layer_store, "--data", w["sts05"], "--out", mixed, *FAST,
            "--array", "features+features_layer-2", "--mix-init", "0.7", "--depth", "1")
    assert r.exit_code == 0, r.output
    r = cli("train-head", "--store", layer_store, "--data", w["sts05"], "--out", single, *FAST, "--depth", "1")
    assert r.exit_code == 0, r.output
    config = json.loads((mixed / "config.json").read_text())
    assert config["head"]["mix"] == 2 and config["head"]["mix_init"] == 0.7 and config["array_layer"] == [-1, -2]
    m_mixed, m_single = (json.loads((d / "metrics.json").read_text()) for d in (mixed, single))
    assert m_mixed["baseline"] == m_single["baseline"]  # the frozen baseline is the last layer alone
    head = headstore.Head.load(mixed)
    assert head.in_dim == 2 * headstore.Store.open(layer_store).dim
    store = headstore.Store.open(layer_store)
    texts = store.texts["text"].to_list()[:12]
    stored = read_features(store, head.array, rows=store.rows_for(texts))
    np.testing.assert_allclose(headstore.Pipeline.from_head(head).encode(texts), head.embed(stored), rtol=0, atol=1e-5)
    r = cli("export", "--head", mixed, "--format", "sentence-transformers", "--out", tmp_path / "st")
    assert r.exit_code == 2 and "several encoder layers" in r.output
    r = cli("eval", "--store", layer_store, "--head", mixed, "--data", w["sts05"], "--out", tmp_path / "ev")
    assert r.exit_code == 0, r.output


def test_unknown_array_in_a_mix_is_named(data_world, layer_store, tmp_path):
    r = cli("train-head", "--store", layer_store, "--data", data_world["sts05"], "--out", tmp_path / "h", *FAST,
            "--array", "features+features_layer-7")
    assert r.exit_code == 2 and "features_layer-7" in r.output


def test_concat_forward_equals_a_loop_reference():
    cfg = HeadConfig(depth=2, hidden=5, in_dim=4, mix=3, mix_mode="concat", residual=False)
    model = StackedMLP(2, cfg, seeds=[0, 1])
    assert not hasattr(model, "mix_logits") and tuple(model.weights[0].shape) == (2, 12, 5)
    x = torch.randn(5, 12)  # 3 arrays of dim 4 side by side, read as they are
    got = model(x)
    assert tuple(got.shape) == (2, 5, 4)
    for h in range(2):
        for i in range(5):
            hidden = torch.nn.functional.gelu(x[i] @ model.weights[0][h] + model.biases[0][h])
            torch.testing.assert_close(got[h, i], hidden @ model.weights[1][h] + model.biases[1][h], rtol=1e-5, atol=1e-6)


def test_concat_needs_no_residual_and_a_known_mode():
    with pytest.raises(ValueError, match="--no-residual"):
        StackedMLP(1, HeadConfig(depth=1, in_dim=4, mix=2, mix_mode="concat"))
    with pytest.raises(ValueError, match=r"valid: \['scalar', 'concat'\]"):
        HeadConfig(mix_mode="stack")


def test_grid_ids_of_scalar_heads_do_not_move():
    from headstore.heads.experiments.grid.spec import head_id
    settings = {"loss": "l1-energy", "depth": 1}
    assert head_id(settings, "d", "f") == head_id({**settings, "mix_mode": "scalar"}, "d", "f")
    assert head_id(settings, "d", "f") != head_id({**settings, "mix_mode": "concat"}, "d", "f")


def test_train_head_reading_layers_side_by_side(data_world, layer_store, tmp_path):
    w, out = data_world, tmp_path / "concat"
    args = ("train-head", "--store", layer_store, "--data", w["sts05"], *FAST, "--array", "features+features_layer-2",
            "--mix-mode", "concat", "--depth", "2", "--hidden", "16")
    r = cli(*args, "--out", tmp_path / "refused")
    assert r.exit_code == 2 and "--no-residual" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "refused").exists()
    r = cli(*args, "--no-residual", "--out", out)
    assert r.exit_code == 0, r.output
    config = json.loads((out / "config.json").read_text())
    assert config["head"]["mix_mode"] == "concat" and config["head"]["mix"] == 2
    head = headstore.Head.load(out)
    store = headstore.Store.open(layer_store)
    assert head.in_dim == 2 * store.dim and head.out_dim == store.dim
    assert tuple(head.model.weights[0].shape) == (1, 2 * store.dim, 16)
    texts = store.texts["text"].to_list()[:12]
    stored = read_features(store, head.array, rows=store.rows_for(texts))
    np.testing.assert_allclose(headstore.Pipeline.from_head(head).encode(texts), head.embed(stored), rtol=0, atol=1e-5)
    r = cli("eval", "--store", layer_store, "--head", out, "--data", w["sts05"], "--out", tmp_path / "ev")
    assert r.exit_code == 0, r.output
    trained, evaluated = (json.loads(p.read_text()) for p in (out / "metrics.json", tmp_path / "ev" / "metrics.json"))
    key = trained["primary"]
    assert evaluated["head"][key] == pytest.approx(trained["head"][key], abs=1e-6)


def test_concat_head_on_retrieval_data_takes_no_default_anchor(data_world, tmp_path):
    """A retrieval task's defaults add the anchor regulariser (||f(x) - x||); a head reading layers side by side has
    no one input x, so the default is dropped, as for a head of another width, and only an anchor the user asks
    for is refused."""
    w, store = data_world, tmp_path / "store"
    r = cli("featurize", "--model", w["model"], "--data", w["beir"], "--layers", "-1,-2", "--store", store,
            "--dtype", "float32")
    assert r.exit_code == 0, r.output
    args = ("train-head", "--store", store, "--data", w["beir"], *FAST, "--array", "features+features_layer-2",
            "--mix-mode", "concat", "--no-residual", "--depth", "2", "--hidden", "16")
    r = cli(*args, "--out", tmp_path / "default")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "default" / "config.json").read_text())["train"]["anchor_weight"] == 0.0
    r = cli(*args, "--anchor-weight", "1", "--out", tmp_path / "asked")
    assert r.exit_code == 2 and "--anchor-weight 0" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "asked").exists()


def test_concat_identity_head_declares_the_width_it_outputs():
    """Issue 54, item 9: W = I over L arrays side by side outputs L x D values, and says so."""
    cfg = HeadConfig(depth=1, in_dim=4, mix=3, mix_mode="concat", residual=False, init="identity")
    model = StackedMLP(1, cfg)
    x = torch.randn(5, 12)
    assert cfg.out_features == 12 == model(x).shape[-1]
    torch.testing.assert_close(model(x)[0], x)
    bare = HeadConfig(depth=0, in_dim=4, mix=3, mix_mode="concat", residual=False)
    assert bare.out_features == 12 == StackedMLP(1, bare)(x).shape[-1]
    with pytest.raises(ValueError, match=r"out_dim == the input's width \(12\)"):
        StackedMLP(1, HeadConfig(depth=1, in_dim=4, out_dim=4, mix=3, mix_mode="concat", residual=False,
                                 init="identity"))


@pytest.fixture(scope="module")
def beir_layers(data_world, tmp_path_factory):
    return two_layer_store(data_world, tmp_path_factory.mktemp("beir-layers"), "beir")


def test_a_bare_concat_head_is_indexed_and_searched(data_world, beir_layers, tmp_path):
    """Issue 54, item 9: `--mix-mode concat --depth 0` outputs both arrays side by side (L x D); `cli index` builds
    an index of that width and `cli search` answers from it (it failed on the width the head declared)."""
    pytest.importorskip("faiss")
    w, head = data_world, tmp_path / "bare"
    r = cli("train-head", "--store", beir_layers, "--data", w["beir"], *FAST, "--array", "features+features_layer-2",
            "--mix-mode", "concat", "--no-residual", "--depth", "0", "--out", head)
    assert r.exit_code == 0, r.output
    store = headstore.Store.open(beir_layers)
    assert headstore.Head.load(head).out_dim == 2 * store.dim
    r = cli("index", "--store", beir_layers, "--head", head, "--data", w["beir"], "--out", tmp_path / "idx")
    assert r.exit_code == 0, r.output
    r = cli("search", "--index", tmp_path / "idx", "--query", "alpha beta", "--k", "3")
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output


def test_concat_of_one_array_keeps_the_retrieval_default_anchor(data_world, beir_layers, tmp_path):
    """Issue 54, item 9: one array read "side by side" is that array: the IR default anchor stays, as for the
    scalar head of the same array."""
    w = data_world
    weights = {}
    for mode in ("scalar", "concat"):
        r = cli("train-head", "--store", beir_layers, "--data", w["beir"], *FAST, "--mix-mode", mode,
                "--out", tmp_path / mode)
        assert r.exit_code == 0, r.output
        weights[mode] = json.loads((tmp_path / mode / "config.json").read_text())["train"]["anchor_weight"]
    assert weights["concat"] == weights["scalar"] > 0


@pytest.mark.parametrize("mode", ["scalar", "concat"])
def test_finetune_refuses_a_head_of_several_arrays_in_one_line(data_world, beir_layers, tmp_path, mode):
    """Issue 54, item 7: `cli finetune` tunes an encoder under a head of one array; a head mixing several was a bare
    KeyError after the store and the data were read. Now: one line, before any work, nothing written."""
    w, head = data_world, tmp_path / "mixed"
    r = cli("train-head", "--store", beir_layers, "--data", w["beir"], *FAST, "--array", "features+features_layer-2",
            "--mix-mode", mode, "--no-residual", "--depth", "1", "--out", head)
    assert r.exit_code == 0, r.output
    r = cli("finetune", "--head", head, "--model", w["model"], "--out", tmp_path / "ft", "--max-steps", "1")
    assert_bad_input(r, str(head), "reads 2 stored arrays", f"a {mode} layer mix", "--array features")
    assert not (tmp_path / "ft").exists()
