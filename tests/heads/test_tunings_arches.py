"""Every setup of `cli finetune` (full, adapters, LoRA) on every architecture featurize's tests cover: a short
run succeeds and its encoder folder loads in featurize; adapters start at the base exactly on each; LoRA
changes only its per-architecture targets; full fine-tuning changes weights in every layer."""
import hashlib
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from headstore.featurize.encoder.adapters import attach_adapters
from headstore.featurize.encoder.architectures import ARCHITECTURES
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.encoder.model import load_encoder
from headstore.featurize.run.local import featurize
from headstore.heads.apply.finetune import FinetuneConfig, finetune
from headstore.heads.apply.tunings import TUNINGS
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.training.run import train_head

from .finetune_world import tiny_beir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "featurize"))
from arch_models import ARCHES, SIZES, build_hf, has_arch  # noqa: E402


def _forward(encoder, texts: list[str]) -> torch.Tensor:  # (B, S, D)
    batch = encoder.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return encoder.model(**batch).last_hidden_state


@pytest.mark.parametrize("arch", ARCHES)
def test_every_setup_on_every_architecture(arch, tmp_path):
    if not has_arch(arch):
        pytest.skip(f"transformers has no {arch}")
    model = build_hf(tmp_path / "model", arch)
    assert load_encoder(str(model), "cpu").model.config.model_type in ARCHITECTURES
    beir = tiny_beir(tmp_path / "beir", n_docs=24, n_train=16, n_test=6)
    featurize(FeaturizeConfig(model=str(model), dtype="float32", batch_tokens=1024), [str(beir)], tmp_path / "store")
    head = tmp_path / "head"
    train_head(str(tmp_path / "store"), str(beir), str(head), HeadConfig(hidden=8, out_dim=4, residual=False),
               TrainConfig(epochs=1, batch_size=4), progress=False)
    base_file = model / "model.safetensors"
    base_hash, base = hashlib.sha256(base_file.read_bytes()).hexdigest(), load_file(str(base_file))
    texts = ["Tree river 12", "Stone 3 alpha"]
    reference = _forward(load_encoder(str(model), "cpu"), texts)
    fresh = load_encoder(str(model), "cpu")
    attach_adapters(fresh.model, 4)
    assert torch.equal(_forward(fresh, texts), reference)  # zero-initialised up-projections: the base exactly
    for setup in sorted(TUNINGS):
        out = tmp_path / setup
        cfg = FinetuneConfig(setup=setup, device="cpu", batch_size=4, max_steps=2, encoder_lr=1e-2, mined_k=0,
                             adapter_size=4, lora_rank=2, lora_alpha=4, keep="last")  # what the two steps did
        summary = finetune(str(head), str(out), cfg, encoder=str(model), progress=False)
        assert summary["steps"] == 2 and 0 < summary["trainable_params"] <= summary["encoder_params"]
        tuned = load_encoder(str(out / "encoder"), "cpu")  # as `cli featurize --model out/encoder` loads it
        states = _forward(tuned, texts)
        assert torch.isfinite(states).all() and not torch.allclose(states, reference, atol=1e-6), setup
        after = load_file(str(out / "encoder" / "model.safetensors"))
        assert set(after) == set(base), setup  # a stock checkpoint of the same model
        changed = {k for k in base if not torch.equal(base[k], after[k])}
        if setup == "adapters":
            assert hashlib.sha256((out / "encoder" / "model.safetensors").read_bytes()).hexdigest() == base_hash
        elif setup == "lora":
            targets = ARCHITECTURES[tuned.model.config.model_type].lora_targets
            assert changed and all(k.split(".")[-2] in targets for k in changed), sorted(changed)
        else:
            layers = {i for k in changed for i in range(SIZES["num_hidden_layers"]) if f"layer.{i}." in k
                      or f"layers.{i}." in k}
            assert layers == set(range(SIZES["num_hidden_layers"])), sorted(changed)
    assert hashlib.sha256(base_file.read_bytes()).hexdigest() == base_hash  # the source folder untouched
