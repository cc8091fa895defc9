"""New text is encoded in the store's numerics: a tiny BERT (saved in bf16, as many checkpoints are) featurized with
`--precision bf16-weights` (the weights held in bf16, on a CPU too) and with `--precision bf16` (fp32 weights under
bf16 autocast); Pipeline gives each store's own rows within a bf16 rounding while the two stores differ by more
than that; featurize's fp32 is fp32 whatever dtype the checkpoint was saved in (a plain torch loop); finetune trains
a bf16 store under bf16 autocast with fp32 master weights."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

import headstore
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.encoder.resolved import resolved_numerics, resolved_precision
from headstore.featurize.run.local import featurize_texts
from headstore.heads.apply.finetune import FinetuneConfig, finetune
from headstore.heads.apply.row_inputs import tuning_precision
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.training.run import train_head

from .conftest import cli
from .finetune_world import tiny_beir, tiny_bert

# a quarter of bf16's unit roundoff (2^-8) at the largest feature: a batch of another shape may tip one rounding in a
# layer (well inside this), another numerics moves every feature by about one rounding of the states (4-5x this)
TOL = 2.0 ** -10
STORES = {"weights": "bf16-weights", "autocast": "bf16"}  # store name -> --precision
NUMERICS = {"weights": "bf16-weights", "autocast": "bf16-autocast"}  # store name -> how its encoder ran on the CPU


@pytest.fixture(scope="module")
def bf16_world(tmp_path_factory):
    from transformers import AutoModel

    root = tmp_path_factory.mktemp("numerics")
    model = tiny_bert(root / "model", layers=2)
    AutoModel.from_pretrained(model).to(torch.bfloat16).save_pretrained(model)  # a checkpoint saved in bf16
    beir = tiny_beir(root / "beir", n_docs=60, n_train=30, n_test=10)
    for name, precision in STORES.items():
        r = cli("featurize", "--model", model, "--data", beir, "--store", root / name, "--dtype", "float32",
                "--precision", precision, "--device", "cpu")
        assert r.exit_code == 0, r.output
        train_head(str(root / name), str(beir), str(root / f"head-{name}"), HeadConfig(hidden=16, out_dim=8, residual=False),
                   TrainConfig(epochs=1, batch_size=8, mined_k=0), progress=False)
    return {"root": root, "model": model, "beir": beir}


def stored_rows(root, name, texts) -> np.ndarray:
    store = headstore.Store.open(root / name)
    return store.features(store.rows_for(texts))


def test_pipeline_encodes_new_text_as_the_store_was_encoded(bf16_world):
    root = bf16_world["root"]
    assert json.loads((root / "weights" / "manifest.json").read_text())["numerics"] == "bf16-weights"
    assert "numerics" not in json.loads((root / "autocast" / "manifest.json").read_text())  # autocast: no part
    texts = headstore.Store.open(root / "weights").texts["text"].to_list()
    rows = {name: stored_rows(root, name, texts) for name in STORES}
    scale = float(np.abs(rows["weights"]).max())
    assert np.abs(rows["weights"] - rows["autocast"]).max() > 2 * TOL * scale  # the two numerics differ
    for name in STORES:
        pipe = headstore.Pipeline.from_head(str(root / f"head-{name}"), device="cpu")
        assert pipe.numerics == NUMERICS[name]
        for batch_size in (1, 7, 64):
            got = pipe.features(texts, batch_size=batch_size)
            assert np.abs(got - rows[name]).max() <= TOL * scale, (name, batch_size)
        head = headstore.Head.load(root / f"head-{name}")
        np.testing.assert_allclose(pipe.encode(texts[:20]), head.embed(rows[name][:20]), rtol=0, atol=1e-4)


def test_fp32_is_fp32_whatever_dtype_the_checkpoint_was_saved_in(bf16_world, tmp_path):
    """featurize's fp32 against a plain loop: the bf16 checkpoint loaded as float32, mean pooled over real tokens."""
    from transformers import AutoModel, AutoTokenizer

    model_dir, texts = bf16_world["model"], ["alpha beta gamma", "river", "tree stone omega kappa lambda 7"]
    featurize_texts(FeaturizeConfig(model=str(model_dir), dtype="float32", precision="fp32", device="cpu"), texts,
                    tmp_path / "s")
    reference_model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    want = []
    for text in texts:
        ids = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            want.append(reference_model(**ids).last_hidden_state[0].mean(dim=0).numpy())  # (D,)
    store = headstore.Store.open(tmp_path / "s")
    np.testing.assert_allclose(store.features(store.rows_for(texts)), np.stack(want), rtol=0, atol=1e-5)


def test_finetune_trains_a_bf16_store_under_bf16_autocast_with_fp32_master_weights(bf16_world, tmp_path):
    root, seen = bf16_world["root"], []

    def observe(module, args, output):  # every encoder forward: the autocast around it, its weights' dtype
        if type(module).__name__ == "BertModel":
            seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
                         next(module.parameters()).dtype, torch.is_grad_enabled()))

    handle = torch.nn.modules.module.register_module_forward_hook(observe)
    try:
        finetune(str(root / "head-weights"), str(tmp_path / "ft"), FinetuneConfig(device="cpu", max_steps=2,
                 batch_size=8), encoder=str(bf16_world["model"]), progress=False)
    finally:
        handle.remove()
    assert {state[:3] for state in seen} == {(True, torch.bfloat16, torch.float32)}  # no-grad encodes too
    assert any(grad for *_, grad in seen)  # the training forwards
    with safe_open(str(tmp_path / "ft" / "encoder" / "model.safetensors"), "pt") as f:  # fp32 master weights kept
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}


@pytest.mark.parametrize("parts, device, half, want", [
    ({"precision": "bf16", "numerics": "bf16-weights"}, "cpu", True, "bf16"),
    ({"precision": "bf16"}, "cpu", True, "bf16"),  # bf16 autocast store (no numerics part)
    ({"precision": "bf16", "numerics": "bf16-weights"}, "cuda", True, "bf16"),
    ({"precision": "fp16", "numerics": "fp16-weights"}, "cuda", True, "fp16"),
    ({"precision": "fp16", "numerics": "fp16-weights"}, "cpu", True, "fp32"),  # fp16 is emulated on a CPU
    ({"precision": "fp32"}, "cpu", True, "fp32"),
    ({"precision": "fp32"}, "cuda", True, "bf16"),  # as before: tensor cores for an fp32 store's tuning
    ({"precision": "bf16", "numerics": "bf16-weights"}, "cpu", False, "fp32"),  # FinetuneConfig(bf16=False)
])
def test_tuning_precision_follows_the_store_numerics(parts, device, half, want):
    assert tuning_precision(parts, device, half) == want


def test_bf16_weights_runs_on_torch_only():
    with pytest.raises(ValueError, match="--backend torch"):
        FeaturizeConfig(precision="bf16-weights", backend="openvino")
    assert [resolved_numerics("bf16-weights", resolved_precision("bf16-weights", device), device)
            for device in ("cpu", "cuda")] == ["bf16-weights", "bf16-weights"]
    assert resolved_precision("bf16-weights", "cpu") == "bf16"
