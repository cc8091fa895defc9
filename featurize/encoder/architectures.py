"""Where each encoder architecture keeps its transformer layers and their output projections: the one table
that fine-tuning (which blocks train), bottleneck adapters (where they hook in) and LoRA (which projections
get low-rank updates) read.

The architectures are those featurize's tests cover (tests/featurize/arch_models.py); a model type outside
the table is refused with a one-line ValueError naming the ones supported.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Layout:
    """Module paths of one architecture, relative to the bare encoder (AutoModel) and to each layer."""

    layers: str  # the ModuleList of transformer layers, bottom first
    attention_out: str  # in a layer: the attention's output projection (Linear d -> d), before its residual
    ffn_out: str  # in a layer: the feed-forward's output projection (Linear d_ff -> d), before its residual
    # LoRA targets (module names PEFT matches by suffix): the query and value projections, as in Hu et al.
    # 2021 (LoRA on W_q and W_v matched adapting all four at the same budget); ModernBERT fuses q, k and v
    # into one Wqkv projection, so it is that one
    lora_targets: tuple[str, ...]
    top: tuple[str, ...] = ()  # modules applied after the last layer: they train with the top block
    never: tuple[str, ...] = ("pooler",)  # modules mean/CLS pooling never uses: never trained


_BERT = Layout("encoder.layer", "attention.output.dense", "output.dense", ("query", "value"))
ARCHITECTURES: dict[str, Layout] = {  # config.model_type -> Layout
    "bert": _BERT,
    "roberta": _BERT,
    "xlm-roberta": _BERT,
    "electra": _BERT,  # its embeddings_project (embedding size -> hidden) trains with the embeddings
    "distilbert": Layout("transformer.layer", "attention.out_lin", "ffn.lin2", ("q_lin", "v_lin")),
    "mpnet": Layout("encoder.layer", "attention.attn.o", "output.dense", ("q", "v")),  # relative bias: bottom block
    "deberta-v2": Layout("encoder.layer", "attention.output.dense", "output.dense", ("query_proj", "value_proj")),
    "modernbert": Layout("layers", "attn.Wo", "mlp.Wo", ("Wqkv",), top=("final_norm",)),
}


def bare_encoder(model) -> torch.nn.Module:
    """The transformers encoder itself (a task model's or a PEFT wrapper's base model)."""
    if hasattr(model, "get_base_model"):  # a peft.PeftModel
        model = model.get_base_model()
    base = getattr(model, "base_model", model)
    return base if base is not None else model


def layout_of(model) -> Layout:
    """The model's Layout; ValueError (one line) for an architecture outside the table."""
    model_type = getattr(bare_encoder(model).config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise ValueError(f"architecture {model_type!r} is not supported for fine-tuning, adapters or LoRA "
                         f"(supported: {sorted(ARCHITECTURES)})")
    return ARCHITECTURES[model_type]


def transformer_layers(model) -> list[torch.nn.Module]:
    """The encoder's transformer layers, bottom first."""
    return list(bare_encoder(model).get_submodule(layout_of(model).layers))


def layer_blocks(model) -> list[list[tuple[str, torch.nn.Parameter]]]:
    """Every trainable parameter in blocks, top first: [layer L-1 (+ the `top` modules), ..., layer 0,
    everything else (embeddings, shared relative-position tables)]; the `never` modules are left out."""
    base, layout = bare_encoder(model), layout_of(model)
    layers = transformer_layers(model)
    blocks = [list(layer.named_parameters()) for layer in reversed(layers)]
    for name in layout.top:
        blocks[0] += [(f"{name}.{n}", p) for n, p in base.get_submodule(name).named_parameters()]
    placed = {id(p) for block in blocks for _, p in block}
    skip = tuple(f"{name}." for name in layout.never)
    blocks.append([(n, p) for n, p in base.named_parameters() if id(p) not in placed and not n.startswith(skip)])
    return blocks
