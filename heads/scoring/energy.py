"""Energies E(a, b) between head outputs: low energy = similar.

Three forms of every energy:
- row-wise: `l1_energy(a, b)` pairs row i of `a` with row i of `b`, `(..., d), (..., d) -> (...)`;
- pairwise: `pairwise_energy(name, q, d)` scores every query against every doc,
  `(..., Q, d), (..., N, d) -> (..., Q, N)`, without materialising a `(Q, N, d)` difference tensor;
- per-query candidates: `candidate_energy(name, q, d)` scores each query against its own c documents,
  `(..., Q, d), (..., Q, c, d) -> (..., Q, c)`, what `pairwise_energy` gives those pairs.
Leading axes (e.g. the head axis H) broadcast in both forms.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from headstore.heads.scoring.pairwise_l1 import pairwise_l1

# eps of the cosine normalisation: keeps an all-zero vector at cosine 0 (energy 1) instead of NaN.
COSINE_EPS = 1e-8


def l1_energy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Manhattan distance sum_k |a_k - b_k| over the last dim: (..., d), (..., d) -> (...)."""
    return (a - b).abs().sum(dim=-1)


def l2_energy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Euclidean distance ||a - b||_2 (not squared) over the last dim: (..., d), (..., d) -> (...).

    The gradient at a == b is 0 (torch's norm backward uses that subgradient), not NaN."""
    return torch.linalg.vector_norm(a - b, ord=2, dim=-1)


def cosine_energy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """1 - cos(a, b) over the last dim, in [0, 2]: (..., d), (..., d) -> (...)."""
    a, b = torch.broadcast_tensors(a, b)
    return 1.0 - F.cosine_similarity(a, b, dim=-1, eps=COSINE_EPS)


ENERGIES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "l1": l1_energy,
    "l2": l2_energy,
    "cosine": cosine_energy,
}


def check_energy(name: str) -> str:
    """Return `name` if it is a known energy, else raise ValueError listing the valid ones."""
    if name not in ENERGIES:
        raise ValueError(f"unknown energy {name!r}; valid energies: {sorted(ENERGIES)}")
    return name


def _normalise(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x, p=2, dim=-1, eps=COSINE_EPS)


def pairwise_energy(name: str, q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Energy of every query against every doc: (..., Q, dim), (..., N, dim) -> (..., Q, N).

    l1 and l2 use `torch.cdist` (p=1 / p=2), which works on the leading axes without building the
    (Q, N, dim) difference tensor; cosine normalises both sides and takes one matmul. Leading axes
    broadcast (a shared doc matrix (N, dim) against per-head queries (H, Q, dim) works).
    Entry [..., i, j] equals ENERGIES[name](q[..., i, :], d[..., j, :]) up to float rounding
    (cdist's l2 uses the matmul expansion for large inputs, so expect ~1e-6 relative error there).
    """
    check_energy(name)
    if q.shape[-1] != d.shape[-1]:
        raise ValueError(f"pairwise_energy: feature dims differ: q {tuple(q.shape)} vs d {tuple(d.shape)}")
    if name == "cosine":
        return 1.0 - _normalise(q) @ _normalise(d).transpose(-1, -2)
    lead = torch.broadcast_shapes(q.shape[:-2], d.shape[:-2])
    q = q.expand(*lead, *q.shape[-2:])
    d = d.expand(*lead, *d.shape[-2:])
    if name == "l1":
        return pairwise_l1(q, d)  # torch.cdist's numbers; a cheaper backward when it trains (heads.scoring.pairwise_l1)
    return torch.cdist(q, d, p=2.0)


def candidate_energy(name: str, q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Energy of each query against its own candidates: (..., Q, dim), (..., Q, c, dim) -> (..., Q, c).

    Costs Q x c instead of Q x N (re-scoring a pool or a shortlist). l1 gives the very numbers of
    `pairwise_energy` (torch.cdist per query), so a ranking of candidates ties and orders as the full ranking
    does; l2 and cosine agree within float rounding (~1e-6: another matmul shape)."""
    check_energy(name)
    if name == "cosine":
        return 1.0 - (_normalise(d) @ _normalise(q).unsqueeze(-1)).squeeze(-1)
    return torch.cdist(q.unsqueeze(-2), d, p=1.0 if name == "l1" else 2.0).squeeze(-2)


def energy_upper_bound(name: str, x: torch.Tensor) -> float:
    """An upper bound of the energy between any two rows of `x` (..., d).

    By the triangle inequality E(a, b) <= ||a|| + ||b|| <= 2 max ||x|| for l1 / l2 (with the
    matching norm); cosine energy is bounded by 2. Useful to pick the Chopra loss's Q from data.
    """
    check_energy(name)
    if name == "cosine":
        return 2.0
    norms = x.detach().abs().sum(-1) if name == "l1" else torch.linalg.vector_norm(x.detach(), dim=-1)
    return 2.0 * float(norms.max()) if norms.numel() else 0.0
