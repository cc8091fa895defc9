"""What the pair losses share: input checks, the impostors of each anchor and which of them train.

`impostor_energies` lists every impostor candidate of each anchor (in-batch mismatches not marked `same`,
and given/mined negatives); `select_impostors` weighs them under `cfg.impostors` (heads.scoring.losses.pairs
module doc): all, the hardest, the semi-hard one, or distance-weighted (Wu et al. 2017).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from headstore.heads.scoring.energy import ENERGIES, pairwise_energy
from headstore.heads.scoring.losses import losses_that
from headstore.heads.scoring.losses.settings import DISTANCE_BINS


def check_inputs(name, za, zp, zn, labels, same, spec):
    if za.dim() != 3 or za.shape != zp.shape:
        raise ValueError(f"{name}: za and zp must both be (H, B, d); got {tuple(za.shape)}, {tuple(zp.shape)}")
    H, B, d = za.shape
    if zn is not None:
        if not spec.negatives:
            raise ValueError(f"{name} takes no negatives (zn); use one of {losses_that(lambda s: s.negatives)}")
        if zn.dim() != 4 or zn.shape[:2] != (H, B) or zn.shape[3] != d:
            raise ValueError(f"{name}: zn must be (H, B, K, d) = ({H}, {B}, K, {d}); got {tuple(zn.shape)}")
    if same is not None and (same.shape not in ((B, B), (H, B, B)) or same.dtype != torch.bool):
        raise ValueError(f"{name}: same must be a ({B}, {B}) or ({H}, {B}, {B}) bool mask; "
                         f"got {tuple(same.shape)} {same.dtype}")
    if labels is None:
        if "positives" not in spec.accepts:
            raise ValueError(f"{name} needs labels (B,) in [0, 1]")
        return None
    labels = torch.as_tensor(labels, dtype=za.dtype, device=za.device)
    if labels.shape not in ((B,), (H, B)):
        raise ValueError(f"{name}: labels must be ({B},) or ({H}, {B}); got {tuple(labels.shape)}")
    if not bool(((labels >= 0) & (labels <= 1)).all()):
        raise ValueError(f"{name}: labels must lie in [0, 1]; got min {labels.min()} max {labels.max()}")
    if spec.accepts == ("positives",):
        if not bool((labels == 1).all()):
            raise ValueError(f"{name} trains on positive pairs only (labels None or all 1); for labelled "
                             f"pairs use one of {losses_that(lambda s: 'binary' in s.accepts)}")
        return None
    if "graded" not in spec.accepts and not bool(((labels == 0) | (labels == 1)).all()):
        raise ValueError(f"{name} needs 0/1 labels, got graded scores")
    return labels


def impostor_energies(za, zp, zn, energy, same, in_batch: bool):
    """Energies of every impostor candidate of each anchor and which are valid.

    Returns E (H, B, M) and valid (B, M) or (H, B, M) (per-head `same`) with columns [in-batch zp[j] (B if in_batch), zn[:, i, k] (K)]."""
    H, B, _ = za.shape
    cols, valid = [], []
    if in_batch:
        cols.append(pairwise_energy(energy, za, zp))  # (H, B, B)
        mask = ~torch.eye(B, dtype=torch.bool, device=za.device)
        valid.append(mask if same is None else mask & ~same)
    if zn is not None:
        cols.append(ENERGIES[energy](za.unsqueeze(2), zn))  # (H, B, K)
        valid.append(torch.ones(B, zn.shape[2], dtype=torch.bool, device=za.device))
    if not cols:
        return za.new_zeros(H, B, 0), torch.zeros(B, 0, dtype=torch.bool, device=za.device)
    if any(v.dim() == 3 for v in valid):
        valid = [v.expand(H, B, v.shape[-1]) for v in valid]
    return torch.cat(cols, dim=-1), torch.cat(valid, dim=-1)


def distance_weights(E_imp, valid) -> torch.Tensor:
    """Weights (H, B, M) of every valid impostor: 1 / (how many of the head's batch impostor energies share
    its histogram bin), normalised to sum 1 per anchor. Each energy range then weighs alike, as if impostors
    were sampled uniformly over distance (Wu et al. 2017) instead of as they come (mostly easy)."""
    E = E_imp.detach()
    valid = valid.expand_as(E)
    weights = torch.zeros_like(E)
    for h in range(E.shape[0]):
        e = E[h][valid[h]]
        if e.numel() == 0:
            continue
        lo, hi = e.min(), e.max()
        width = (hi - lo).clamp_min(torch.finfo(E.dtype).eps) / DISTANCE_BINS
        bins = ((E[h] - lo) / width).floor().clamp(0, DISTANCE_BINS - 1).long()  # (B, M)
        counts = torch.bincount(bins[valid[h]], minlength=DISTANCE_BINS).to(E.dtype)
        weights[h] = valid[h].to(E.dtype) / counts[bins].clamp_min(1.0)
    return weights / weights.sum(-1, keepdim=True).clamp_min(torch.finfo(E.dtype).tiny)


def select_impostors(E_imp, valid, E_pos, mode: str) -> torch.Tensor:
    """Weights (H, B, M) of the impostors used under `mode` (see module doc): 0/1, or per-anchor
    weights summing to 1 for distance-weighted."""
    weights = valid.to(E_imp.dtype).expand_as(E_imp)
    if mode == "all" or E_imp.shape[-1] == 0:
        return weights
    if mode == "distance-weighted":
        return distance_weights(E_imp, valid)
    inf = torch.finfo(E_imp.dtype).max
    E = E_imp.detach().masked_fill(~valid, inf)  # (H, B, M)
    if mode == "semi-hard":
        farther = (E > E_pos.detach().unsqueeze(-1)) & valid
        E_semi = E.masked_fill(~farther, inf)
        E = torch.where(farther.any(-1, keepdim=True), E_semi, E)  # fall back to hardest
    one_hot = F.one_hot(E.argmin(-1), E.shape[-1]).to(E_imp.dtype)
    return one_hot * valid.any(-1).to(E_imp.dtype).unsqueeze(-1)  # anchors without impostors: none


def weighted_mean(values, weights) -> torch.Tensor:
    """Per-head mean of values over entries with weight: (H, ...) -> (H,)."""
    w = weights.flatten(1)
    return (values.flatten(1) * w).sum(-1) / w.sum(-1).clamp_min(1.0)
