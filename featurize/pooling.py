"""Poolings: one vector per text from a (B, S, D) hidden state and its (B, S) attention mask.

All are mask-aware: padding positions never contribute. Computed in float32 whatever the
model's compute dtype, so autocast does not cost pooled precision.
"""

from __future__ import annotations

import torch


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
