"""`ce`: a classifier head's loss on labelled texts, softmax cross-entropy with label smoothing.

Same signature as every class loss (heads.scoring.losses.classes):

    ce_loss(za, zp, zn=None, labels=Y, *, energy="l1", cfg=LossConfig(), same=None) -> (H,)

The head ends in one output per class (heads.kinds.labels.classifier_width): its outputs `za` (H, B, L)
are the class scores (logits) and `Y` (B, L) or (H, B, L) the label codes. `cfg.groups` cuts the L outputs
into consecutive blocks, one softmax each: `()` is one block (flat labels: the leaf softmax); a hierarchy
(`--hierarchy`) gives one block per level of the label tree (its code is one one-hot block per level,
heads.kinds.labels), so the loss is the mean over levels of each level's cross-entropy. Each block's
target is its part of the code made a distribution (whatever the code's scale), smoothed toward uniform:
`T = (1 - eps) y + eps / n` over the block's n outputs (Szegedy et al. 2016; eps = cfg.label_smoothing).
Every text is its own example: `zp`, `zn` and `same` (the pair losses' views) are not used.
"""
from __future__ import annotations

import torch

from headstore.heads.scoring.losses.settings import LossConfig


def _targets(name: str, za: torch.Tensor, labels) -> torch.Tensor:
    """The label codes as (H, B, L) on za's device; ValueError naming what is wrong."""
    if za.dim() != 3:
        raise ValueError(f"{name}: za must be (H, B, L) class scores; got {tuple(za.shape)}")
    if labels is None:
        raise ValueError(f"{name} needs label codes Y (B, L) or (H, B, L) of labelled texts (--format labels)")
    H, B, L = za.shape
    Y = torch.as_tensor(labels, dtype=za.dtype, device=za.device)
    if Y.dim() == 2:
        Y = Y.unsqueeze(0).expand(H, -1, -1)
    if Y.shape != (H, B, L):
        raise ValueError(f"{name}: the head outputs {L} scores but the label codes have shape {tuple(Y.shape)}; "
                         f"a classifier head ends in one output per class (or per tree node with --hierarchy)")
    return Y


def ce_loss(za, zp=None, zn=None, labels=None, *, energy="l1", cfg=None, same=None):
    """Mean over the output blocks of softmax cross-entropy with label smoothing, averaged over the batch (module doc)."""
    cfg = cfg or LossConfig()
    Y = _targets("ce", za, labels)
    groups = tuple(cfg.groups) or (za.shape[-1],)
    if sum(groups) != za.shape[-1]:
        raise ValueError(f"ce: output blocks {groups} do not add up to the head's {za.shape[-1]} outputs")
    eps = float(cfg.label_smoothing)
    total = za.new_zeros(za.shape[0])
    for z, y in zip(za.split(groups, dim=-1), Y.split(groups, dim=-1)):  # (H, B, n) each
        target = y / y.sum(-1, keepdim=True).clamp_min(1e-12)
        target = (1.0 - eps) * target + eps / z.shape[-1]
        total = total - (target * torch.log_softmax(z, dim=-1)).sum(-1).mean(-1)
    return total / len(groups)
