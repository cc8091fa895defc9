"""Poolings: one vector per text from a (B, S, D) hidden state and its (B, S) attention mask, and
`pooled_forward`, the one encoder-forward-then-pool step every caller shares.

All poolings are mask-aware: padding positions never contribute. Computed in float32 whatever the
model's compute dtype, so autocast does not cost pooled precision.
"""

from __future__ import annotations

import contextlib

import torch

from headstore.featurize.config import POOLING_NAMES


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Average of the hidden states of real (mask == 1) tokens. (B, S, D), (B, S) -> (B, D)."""
    weights = mask.to(torch.float32).unsqueeze(-1)  # (B, S, 1)
    summed = (hidden.to(torch.float32) * weights).sum(dim=1)  # (B, D)
    counts = weights.sum(dim=1).clamp(min=1.0)  # (B, 1); an all-padding row gives 0, not NaN
    return summed / counts


def cls_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Hidden state of the first token ([CLS] for BERT). (B, S, D) -> (B, D)."""
    return hidden[:, 0].to(torch.float32)


def max_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-dimension maximum over real tokens; padding is set to -inf so it never wins."""
    hidden = hidden.to(torch.float32)
    padding = (mask == 0).unsqueeze(-1)  # (B, S, 1)
    return hidden.masked_fill(padding, float("-inf")).amax(dim=1)  # (B, D)


POOLINGS = {"mean": mean_pool, "cls": cls_pool, "max": max_pool}
assert sorted(POOLINGS) == sorted(POOLING_NAMES), "featurize.config lists the poolings implemented here"


def compute_context(device_type: str, precision: str):
    """Autocast to bfloat16 for precision "bf16" (matmuls in bf16, reductions kept in fp32), else
    plain float32."""
    assert precision in ("fp32", "bf16"), precision
    if precision == "bf16":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def pooled_forward(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, pooling: str,
                   layers: tuple[int, ...] = (-1,), precision: str = "fp32") -> list[torch.Tensor]:
    """THE encode-and-pool step (featurize, finetune and Pipeline all call it): the encoder's hidden
    states of `layers`, pooled, one float32 (B, D) tensor per layer.

    `attention_mask` None means no text of the batch is padded (the encoder then takes its fast
    unmasked path, and mean pooling is a plain mean). Gradients flow unless the caller disables them
    (featurize runs it under `torch.inference_mode`, finetune trains through it)."""
    want_hidden = tuple(layers) != (-1,)
    with compute_context(input_ids.device.type, precision):
        out = model(input_ids=input_ids, attention_mask=attention_mask,
                    output_hidden_states=want_hidden, return_dict=True)
    hidden = [out.hidden_states[layer] for layer in layers] if want_hidden else [out.last_hidden_state]
    if attention_mask is None and pooling == "mean":  # no padding: a plain mean, no (B, S, D) temporary
        return [h.to(torch.float32).mean(dim=1) for h in hidden]
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    return [POOLINGS[pooling](h, mask) for h in hidden]
