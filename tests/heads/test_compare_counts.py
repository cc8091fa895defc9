"""Issue 37: `cli compare`'s trainable parameters of a tuned encoder are those that trained (top-k: the top k
blocks; gradual: the blocks unfrozen by the end), counted from finetune.json, against the tensors that changed
(full fine-tuning) and against the adapters' and LoRA matrices' sizes by hand."""
import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from headstore.heads.apply.finetune import FinetuneConfig, finetune
from headstore.heads.experiments.compare.setups import _tuned_result, head_parameters, tuned_trainable

from .finetune_world import trained_head_world

HIDDEN, LAYERS = 32, 3  # the tiny BERT of finetune_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return trained_head_world(tmp_path_factory.mktemp("counts"), layers=LAYERS, epochs=2)


def tuned(world, name: str, **settings):
    """(finetune's output folder, the compare step's record of it)."""
    root, model, _, _, head = world
    if "keep" in {f.name for f in dataclasses.fields(FinetuneConfig)}:
        settings["keep"] = "last"  # the final state: what the steps trained
    out = root / name
    summary = finetune(str(head), str(out), FinetuneConfig(device="cpu", batch_size=8, encoder_lr=1e-3, **settings),
                       encoder=str(model), progress=False)
    return out, _tuned_result(summary)


def changed_parameters(world, encoder_dir) -> int:
    before = load_file(str(world[1] / "model.safetensors"))
    after = load_file(str(encoder_dir / "model.safetensors"))
    assert before.keys() == after.keys()
    return sum(before[k].numel() for k in before if not torch.equal(before[k], after[k]))


@pytest.mark.parametrize("name, settings, blocks", [
    ("top1", {"unfreeze": "top-k", "top_k": 1, "max_steps": 3}, 1),
    ("gradual", {"unfreeze": "gradual", "unfreeze_interval": 2, "max_steps": 4}, 2),  # 1, 1, 2, 2 blocks
])
def test_full_fine_tuning_counts_the_blocks_that_trained(world, name, settings, blocks):
    out, record = tuned(world, name, setup="full", **settings)
    trained = changed_parameters(world, out / "encoder")
    assert max(record["unfrozen_at_step"].values()) == blocks
    assert record["encoder_trainable_parameters"] == trained
    assert record["trainable_params"] > trained  # finetune's own count: every block
    head = head_parameters(out / "head")
    assert record["trainable_parameters"] == trained + head
    assert tuned_trainable(record, out) == {None: trained, "joint": trained + head}  # cosine row: no head


def test_adapters_and_lora_count_the_matrices_of_the_top_blocks(world):
    m, r = FinetuneConfig().adapter_size, FinetuneConfig().lora_rank
    adapters_per_layer = 2 * (HIDDEN * m + m + m * HIDDEN + HIDDEN)  # after attention and after the FFN
    lora_per_layer = 2 * r * (HIDDEN + HIDDEN)  # A (r x d) and B (d x r) on the query and the value
    for setup, settings, expected in (
            ("adapters", {"unfreeze": "top-k", "top_k": 1}, adapters_per_layer),
            ("lora", {"unfreeze": "top-k", "top_k": 2}, 2 * lora_per_layer),
            ("lora", {"unfreeze": "all"}, LAYERS * lora_per_layer)):
        out, record = tuned(world, f"{setup}-{settings.get('top_k', 'all')}", setup=setup, max_steps=1, **settings)
        assert record["encoder_trainable_parameters"] == expected, (setup, settings)


def test_a_record_from_before_the_count_is_recounted(world):
    out, record = tuned(world, "old-record", setup="full", unfreeze="top-k", top_k=1, max_steps=1)
    old = {k: v for k, v in record.items() if k != "encoder_trainable_parameters"}
    old["trainable_parameters"] = json.loads((out / "finetune.json").read_text())["trainable_params"]  # every block
    assert tuned_trainable(old, out) == tuned_trainable(record, out)
