"""`cli finetune --setup adapters|lora` on a tiny random BERT: train, re-featurize, evaluate; the base weights
untouched; adapters start at the base and move away from it; the LoRA folder is a stock model whose
sentence-transformers encode equals the store's rows; each store gets its own fingerprint."""
import hashlib
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from headstore.cli import main
from headstore.featurize.encoder.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, attach_adapters, save_adapters
from headstore.featurize.encoder.model import load_encoder, model_identity
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.apply.finetune import FinetuneConfig, finetune
from headstore.heads.apply.pipeline import Pipeline
from headstore.heads.apply.tunings import TUNINGS

from .finetune_world import trained_head_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return trained_head_world(tmp_path_factory.mktemp("tunings"), layers=2, epochs=1, n_docs=40, n_train=24, n_test=8)


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tune(world, name, setup, **kw):
    root, model, beir, store, head = world
    base_hash = _sha256(model / "model.safetensors")
    cfg = FinetuneConfig(setup=setup, device="cpu", batch_size=8, encoder_lr=1e-2, max_steps=3, mined_k=0, keep="last",
                         **kw)
    summary = finetune(str(head), str(root / name), cfg, encoder=str(model), progress=False)
    assert _sha256(model / "model.safetensors") == base_hash  # the source encoder's files untouched
    return root / name, summary


def _featurize(world, enc_dir, name):
    root, _, beir, *_ = world
    r = CliRunner().invoke(main, ["featurize", "--model", str(enc_dir), "--data", str(beir), "--store",
                                  str(root / name), "--dtype", "float32"])
    assert r.exit_code == 0, r.output
    return FeatureStore.open(root / name)


def test_adapters_train_store_eval_and_keep_the_base_weights(world):
    root, model, beir, store, head = world
    out, summary = _tune(world, "adapters", "adapters", adapter_size=4)
    enc = out / "encoder"
    # the base weights byte for byte, plus the adapters
    assert _sha256(enc / "model.safetensors") == _sha256(model / "model.safetensors")
    assert json.loads((enc / "config.json").read_text()) == json.loads((model / "config.json").read_text())
    adapters = load_file(str(enc / ADAPTER_WEIGHTS))
    assert len(adapters) == 2 * 2 * 4  # 2 layers x (attention, ffn) x (down, up) x (weight, bias)
    assert any(k.endswith("up.weight") and v.abs().sum() > 0 for k, v in adapters.items())  # trained from zero
    # 2 layers x 2 adapters x (32*4 + 4 + 4*32 + 32) parameters
    assert summary["trainable_params"] == 2 * 2 * (32 * 4 + 4 + 4 * 32 + 32)
    s1, s2 = FeatureStore.open(store), _featurize(world, enc, "store-adapters")
    assert s2.fingerprint == summary["fingerprint"] != s1.fingerprint
    base_rows, tuned_rows = s1.features(), s2.features()
    assert base_rows.shape == tuned_rows.shape and np.abs(base_rows - tuned_rows).max() > 1e-4
    texts = s2.texts.sort("row")  # Pipeline (the head's encoder_dir) loads the adapters as featurize does
    pipeline = Pipeline.from_head(str(out / "head"), device="cpu")
    np.testing.assert_allclose(pipeline.features(texts["text"].to_list()), s2.features(texts["row"].to_numpy()),
                               atol=1e-5)
    r = CliRunner().invoke(main, ["eval", "--store", str(root / "store-adapters"), "--head", str(out / "head"),
                                  "--data", str(beir), "--out", str(root / "eval-adapters")])
    assert r.exit_code == 0, r.output
    assert "manhattan_ndcg@10" in json.loads((root / "eval-adapters" / "metrics.json").read_text())["head"]
    # plain sentence-transformers would silently drop the hooks: export refuses in one line
    r = CliRunner().invoke(main, ["export", "--head", str(out / "head"), "--format", "sentence-transformers",
                                  "--out", str(root / "export-adapters")])
    assert r.exit_code != 0 and "adapters" in r.output.strip().splitlines()[-1], r.output


def test_fresh_adapters_give_the_base_features_under_a_new_fingerprint(world, tmp_path):
    root, model, beir, store, _ = world
    enc = tmp_path / "fresh"
    enc.mkdir()
    for f in model.iterdir():
        (enc / f.name).write_bytes(f.read_bytes())
    base = load_encoder(str(model), "cpu")
    attach_adapters(base.model, 8)
    save_adapters(base.model, enc, 8)
    assert (enc / ADAPTER_CONFIG).is_file()
    assert model_identity(str(enc)).weights_hash != model_identity(str(model)).weights_hash
    fresh = _featurize(world, enc, "store-fresh-adapters")
    assert fresh.fingerprint != FeatureStore.open(store).fingerprint
    np.testing.assert_array_equal(fresh.features(), FeatureStore.open(store).features())  # up = 0: the identity


def test_lora_saves_merged_weights_that_sentence_transformers_loads(world):
    st = pytest.importorskip("sentence_transformers")
    pytest.importorskip("peft")
    root, model, *_ = world
    out, summary = _tune(world, "lora", "lora", lora_rank=2, lora_alpha=4)
    enc = out / "encoder"
    before, after = load_file(str(model / "model.safetensors")), load_file(str(enc / "model.safetensors"))
    assert set(before) == set(after)  # a stock checkpoint: no lora_A / lora_B keys left
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    # only the LoRA targets moved: W + alpha/r B A on each layer's query and value weights
    assert changed == {f"encoder.layer.{i}.attention.self.{m}.weight" for i in range(2) for m in ("query", "value")}
    assert summary["trainable_params"] == 2 * 2 * (2 * 32 + 32 * 2)  # layers x targets x (A + B)
    s3 = _featurize(world, enc, "store-lora")
    assert s3.fingerprint == summary["fingerprint"] != FeatureStore.open(world[3]).fingerprint
    texts = s3.texts.sort("row")
    reference = st.SentenceTransformer(str(enc), device="cpu").encode(texts["text"].to_list(), convert_to_numpy=True)
    np.testing.assert_allclose(s3.features(texts["row"].to_numpy()), reference, atol=1e-5)


def test_setup_registry_and_bad_values():
    assert sorted(TUNINGS) == ["adapters", "full", "lora"]
    with pytest.raises(ValueError, match="adapters.*full.*lora"):
        FinetuneConfig(setup="prefix")
    with pytest.raises(ValueError, match="adapter_size"):
        FinetuneConfig(setup="adapters", adapter_size=0)
    assert FinetuneConfig(setup="lora").peak_encoder_lr == TUNINGS["lora"].default_lr
    assert FinetuneConfig(setup="lora", encoder_lr=3e-3).peak_encoder_lr == 3e-3


def test_cli_finetune_setup_options(world):
    root, model, beir, store, head = world
    out = root / "cli-adapters"
    r = CliRunner().invoke(main, ["finetune", "--head", str(head), "--out", str(out), "--model", str(model),
                                  "--setup", "adapters", "--adapter-size", "3", "--max-steps", "1", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "finetune.json").read_text())
    assert summary["setup"] == "adapters" and summary["setup_settings"] == {"adapter_size": 3}
    assert json.loads((out / "encoder" / ADAPTER_CONFIG).read_text())["size"] == 3
    r = CliRunner().invoke(main, ["finetune", "--head", str(head), "--out", str(out), "--setup", "prefix"])
    assert r.exit_code != 0 and "lora" in r.output
