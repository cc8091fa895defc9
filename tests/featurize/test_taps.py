"""`featurize --taps`: every layer's attention output, MLP intermediate and block output, mean-pooled, as arrays of
the store. Checked against forward hooks the test places itself on the architectures' own module names (another
module than the taps' hooks for the MLP: the intermediate activation's output, not the output projection's input),
pooled by a plain loop; and a tap store killed mid-run resumes to the uninterrupted run's bytes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from arch_models import build_hf
from featurize_helpers import random_texts
from test_crash_resume import CHILD

from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.encoder.resolved import resolve
from headstore.featurize.encoder.pooling import pooled_forward
from headstore.featurize.encoder.taps import tap_arrays, tap_part
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.verify import store_info, verify_store

# the reference's own hook sites, by the HF module names of each architecture (not the layout table's):
# attention output projection, the MLP's activation output (= the output projection's input), the layer
REFERENCE_SITES = {
    "bert": ("encoder.layer.{i}.attention.output.dense", "encoder.layer.{i}.intermediate", "encoder.layer.{i}"),
    "roberta": ("encoder.layer.{i}.attention.output.dense", "encoder.layer.{i}.intermediate", "encoder.layer.{i}"),
    "distilbert": ("transformer.layer.{i}.attention.out_lin", "transformer.layer.{i}.ffn.activation",
                   "transformer.layer.{i}"),
}
SETTINGS = dict(dtype="float32", batch_tokens=128, commit_seconds=0, chunk_rows=4, shard_rows=16, device="cpu",
                window_texts=25, taps=True, backend="torch")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tap-models")
    return {arch: str(build_hf(root / arch, arch)) for arch in REFERENCE_SITES}


def reference_taps(model, n_layers: int, arch: str, ids: torch.Tensor, mask: torch.Tensor) -> dict:
    """{tap name: (B, D) masked means} from the test's own hooks, pooled in a loop over texts."""
    got = {}
    handles = []
    for i in range(n_layers):
        for kind, site in zip(("attn", "mlp", "block"), REFERENCE_SITES[arch]):
            module = model.get_submodule(site.format(i=i))
            handles.append(module.register_forward_hook(
                lambda m, a, out, key=f"tap_{kind}_{i + 1}": got.__setitem__(key, out[0] if isinstance(out, tuple)
                                                                               else out)))
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=mask)
    for h in handles:
        h.remove()
    pooled = {}
    for name, states in got.items():
        rows = []
        for b in range(states.shape[0]):
            real = [states[b, s].double().numpy() for s in range(states.shape[1]) if mask[b, s]]
            rows.append(sum(real) / len(real))
        pooled[name] = np.stack(rows)
    return pooled


@pytest.mark.parametrize("arch", sorted(REFERENCE_SITES))
def test_taps_equal_hooks_on_the_same_forward(models, arch):
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(models[arch]).eval()
    tokenizer = AutoTokenizer.from_pretrained(models[arch])
    enc = tokenizer(random_texts(6, seed=3, max_words=12), padding=True, return_tensors="pt")
    names = tap_arrays(tap_part(models[arch]))
    assert len(names) == 3 * model.config.num_hidden_layers if arch != "distilbert" else 3 * model.config.n_layers
    reference = reference_taps(model, len(names) // 3, arch, enc["input_ids"], enc["attention_mask"])
    with torch.inference_mode():
        pooled = pooled_forward(model, enc["input_ids"], enc["attention_mask"], "mean", (-1,),
                                taps=[(t["tap"], t["layer"]) for t in names.values()])
    assert len(pooled) == 1 + len(names)
    for (name, info), got in zip(names.items(), pooled[1:]):
        assert got.shape == (6, info["dim"]), name
        np.testing.assert_allclose(got.numpy(), reference[name], atol=1e-5, rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(pooled[0].numpy(), reference[f"tap_block_{len(names) // 3}"], atol=1e-5)


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_tap_store_holds_each_texts_taps(models, arch, tmp_path):
    """The store's tap arrays equal the reference hooks run on each text alone (no padding, another batch)."""
    from transformers import AutoModel, AutoTokenizer

    texts = random_texts(30, seed=5)
    summary = featurize_texts(FeaturizeConfig(model=models[arch], **SETTINGS), texts, tmp_path / "s")
    store = FeatureStore.open(tmp_path / "s")
    part = store.manifest["taps"]
    assert [a for a in store.arrays if a.startswith("tap_")] == list(tap_arrays(part))
    width = sum(part["dims"].values()) * part["n_layers"]
    assert summary["bytes_per_text"] == {"features": 4 * 32, "taps": 4 * width, "total": 4 * (32 + width)}
    assert store_info(tmp_path / "s")["bytes_per_text"] == summary["bytes_per_text"]
    assert verify_store(tmp_path / "s") == []
    model = AutoModel.from_pretrained(models[arch]).eval()
    tokenizer = AutoTokenizer.from_pretrained(models[arch])
    rows = store.rows_for(store.row_ids(texts[:8]))
    for text, row in zip(texts[:8], rows):
        enc = tokenizer([text], truncation=True, max_length=store.manifest["max_length"], return_tensors="pt")
        reference = reference_taps(model, part["n_layers"], arch, enc["input_ids"], enc["attention_mask"])
        for name in tap_arrays(part):
            np.testing.assert_allclose(store.features([row], name)[0], reference[name][0], atol=2e-5, rtol=1e-4,
                                       err_msg=name)


def test_taps_change_the_fingerprint_and_refuse_what_cannot_hook(models, tmp_path):
    featurize_texts(FeaturizeConfig(model=models["bert"], **{**SETTINGS, "taps": False}), random_texts(4), tmp_path / "s")
    with pytest.raises(ValueError, match="taps"):  # the store without taps refuses tap rows: another fingerprint
        featurize_texts(FeaturizeConfig(model=models["bert"], **SETTINGS), random_texts(5), tmp_path / "s")
    with pytest.raises(ValueError, match="--backend torch"):
        FeaturizeConfig(model=models["bert"], taps=True, backend="onnx")
    with pytest.raises(ValueError, match="--packing off"):
        FeaturizeConfig(model=models["bert"], taps=True, packing="on")
    assert not resolve(FeaturizeConfig(model=models["bert"], taps=True), "cuda").packing  # taps read padded batches


def test_a_tap_store_resumes_bit_for_bit(models, tmp_path):
    texts = random_texts(60)
    config = {**SETTINGS, "model": models["bert"], "layers": [-1, -2]}
    clean = tmp_path / "clean"
    featurize_texts(FeaturizeConfig(**{**config, "layers": (-1, -2)}), texts, clean)
    killed = tmp_path / "killed"
    args = {"config": config, "texts": texts, "store": str(killed), "die_inside_zarr_write": None}
    env = {"HEADSTORE_CRASH_AT": "committed:3", "TOKENIZERS_PARALLELISM": "false", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": ":".join(sys.path)}
    result = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    partial = FeatureStore.open(killed)
    assert 0 < partial.n_texts < len(texts)
    featurize_texts(FeaturizeConfig(**{**config, "layers": (-1, -2)}), texts, killed)
    a, b = FeatureStore.open(clean), FeatureStore.open(killed)
    assert a.arrays == b.arrays and len(a.arrays) == 2 + 3 * 2
    assert a.texts.equals(b.texts)
    for name in a.arrays:
        np.testing.assert_array_equal(a.features(name), b.features(name), err_msg=name)
    assert verify_store(killed) == []
