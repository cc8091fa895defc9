"""Which taps a head should read, chosen on the training pairs alone: a Head2Toe-style group lasso (Evci et al.
2022), selection before width.

A linear siamese map reads every candidate array side by side, each standardised on the training texts:
f(x) = sum_t x_t W_t, W_t (d_t, rank). It is trained on the training pairs to make cos(f(a), f(b)) match the pair's
target in Pearson's sense (a batch's correlation with an STS score; 1 for a positive pair, 0 for the same anchor with a shuffled partner), with the group
penalty `penalty * sum_t sqrt(d_t) ||W_t||_F` applied as a proximal step after each Adam step (group soft-thresholding:
groups the data does not need go exactly to 0). A tap's score is its group's norm; the head then reads the first
array (`features`) and the `keep` best-scored taps. Dev and test are never read.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from headstore.heads.settings.taps import TapSelectConfig


def pair_targets(anchor: np.ndarray, positive: np.ndarray, labels: np.ndarray | None,
                 seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(anchor rows, partner rows, targets): graded/binary pairs as they are; positive pairs (labels None) each with
    target 1 and once more with a shuffled partner, target 0."""
    if labels is not None:
        return anchor, positive, labels.astype(np.float32)
    shuffled = np.random.default_rng(seed).permutation(positive)
    targets = np.concatenate([np.ones(len(anchor)), np.zeros(len(anchor))]).astype(np.float32)
    return np.concatenate([anchor, anchor]), np.concatenate([positive, shuffled]), targets


def _standardized(blocks: list[np.ndarray], rows: np.ndarray) -> list[torch.Tensor]:
    """Each (N, d_t) block's columns centred and scaled on `rows` (the training texts)."""
    out = []
    for block in blocks:
        x = torch.from_numpy(np.ascontiguousarray(block, dtype=np.float32))
        fit = x[torch.from_numpy(rows)]
        out.append((x - fit.mean(0)) / fit.std(0).clamp_min(1e-6))
    return out


def group_scores(blocks: list[np.ndarray], anchor: np.ndarray, partner: np.ndarray, target: np.ndarray,
                 cfg: TapSelectConfig) -> tuple[np.ndarray, list[float]]:
    """((T,) the group norm ||W_t||_F of each block after group-lasso training, the training pairs' mean batch
    Pearson per epoch: how well the map fits) (blocks: (N, d_t) features indexed by the pairs' rows)."""
    rows = np.unique(np.concatenate([anchor, partner]))
    xs = _standardized(blocks, rows)
    gen = torch.Generator().manual_seed(cfg.seed)
    # a small start: a group's final norm is what the pairs put there, not its random draw's size
    weights = [torch.nn.Parameter(torch.randn(x.shape[1], cfg.rank, generator=gen) * 1e-2) for x in xs]
    sizes = torch.tensor([math.sqrt(x.shape[1]) for x in xs])
    optim = torch.optim.SGD(weights, lr=cfg.lr, momentum=0.9)
    a, p, y = (torch.from_numpy(np.asarray(v)) for v in (anchor, partner, target))
    fit = []
    for _ in range(cfg.epochs):
        pearsons = []
        for batch in torch.randperm(len(y), generator=gen).split(cfg.batch_size):
            fa = sum(x[a[batch]] @ w for x, w in zip(xs, weights))  # (B, rank)
            fp = sum(x[p[batch]] @ w for x, w in zip(xs, weights))
            loss = -_pearson(F.cosine_similarity(fa, fp, dim=-1), y[batch])
            pearsons.append(-loss.item())
            optim.zero_grad()
            loss.backward()
            optim.step()
            with torch.no_grad():  # the proximal step of the group penalty
                for w, size in zip(weights, sizes):
                    w.mul_((1 - cfg.lr * cfg.penalty * size / w.norm().clamp_min(1e-12)).clamp_min(0.0))
        fit.append(float(np.mean(pearsons)))
    return np.array([float(w.detach().norm()) for w in weights]), fit


def check_fit(scores: np.ndarray, fit: list[float], lr: float) -> None:
    """ValueError where the group lasso diverged: a score or the fit not finite, or the training pairs' Pearson
    lower in the last epoch than in the first (at too large a step the norms grow with the taps' widths and
    tails, and the ranking follows them, not the pairs: 35 mean and max-pooled STS-B taps at 0.1, docs/taps.md)."""
    if np.isfinite(scores).all() and np.isfinite(fit).all() and (len(fit) < 2 or fit[-1] > fit[0]):
        return
    raise ValueError(f"the group lasso did not fit at --lr {lr:g} (the training pairs' Pearson by epoch: "
                     f"{', '.join(f'{v:.3f}' for v in fit)}); its ranking would not be the pairs': rerun with a "
                     f"smaller --lr (e.g. {lr / 10:g})")


def _pearson(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x, y = x - x.mean(), y - y.mean()
    return (x * y).sum() / (x.norm() * y.norm()).clamp_min(1e-12)


def chosen_spec(first: str, names: list[str], scores: np.ndarray, keep: int) -> str:
    """`first+tap_a+tap_b...`: the first array, then the `keep` best-scored taps (ties: the earlier name) with a
    non-zero score, in the store's order."""
    order = sorted(range(len(names)), key=lambda i: (-scores[i], i))
    picked = sorted(i for i in order[:keep] if scores[i] > 0)
    return "+".join([first, *(names[i] for i in picked)])
