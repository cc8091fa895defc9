"""A document memory's moves: the judged documents' vectors edited toward their training queries (NUDGE,
Zeighami et al., ICLR 2025), each the exact maximiser of a constrained objective (docs/memory.md derives them).

Every move takes D (n, d) the judged documents' vectors, Q (P, d) the training queries' vectors, owner (P,) the
row of D each query was judged relevant to, and gamma (the bound on the change) and returns the edited (n, d):

- `nudge-m`: max sum_i q_i . (d + delta) s.t. ||delta||_2 <= gamma  ->  d + gamma g / ||g||, g = sum_i q_i;
- `nudge-n`: the same objective on the unit sphere: max g . x s.t. ||x|| = 1, ||x - d|| <= gamma (d unit): x = g/||g||
  where that is within the bound, else the boundary point of the cap in the plane of d and g;
- `l1-box`: min sum_i ||q_i - x||_1 s.t. ||x - d||_inf <= gamma: per coordinate, the median of the q_ik nearest
  d_k, clipped into [d_k - gamma, d_k + gamma] (the L1 energy's move: a median, not a mean).

A document whose queries sum to 0 (nudge-m / nudge-n) is left as it is; gamma = inf is the unconstrained move.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

NORM_EPS = 1e-12  # below this a query sum has no direction: the document is not moved


def query_sums(Q: torch.Tensor, owner: torch.Tensor, n: int) -> torch.Tensor:
    """(n, d): g_j = the sum of the training queries judged relevant to document j."""
    return torch.zeros(n, Q.shape[1], dtype=Q.dtype, device=Q.device).index_add_(0, owner, Q)


def nudge_m(D: torch.Tensor, Q: torch.Tensor, owner: torch.Tensor, gamma: float) -> torch.Tensor:
    """d + gamma * g / ||g||: the change of norm at most gamma that most raises sum_i q_i . d (Cauchy-Schwarz)."""
    g = query_sums(Q, owner, len(D))
    norm = g.norm(dim=1, keepdim=True)
    if gamma == float("inf"):
        raise ValueError("nudge-m: gamma must be finite (the objective is unbounded without the bound)")
    return torch.where(norm > NORM_EPS, D + gamma * g / norm.clamp_min(NORM_EPS), D)


def nudge_n(D: torch.Tensor, Q: torch.Tensor, owner: torch.Tensor, gamma: float) -> torch.Tensor:
    """argmax g . x over unit x with ||x - d|| <= gamma (d unit; D is normalised first).

    On the sphere ||x - d||^2 = 2 - 2 x.d, so the bound is x . d >= c = 1 - gamma^2 / 2 (a cap around d). The
    cap's best point is g/||g|| when that lies in it; else it is on the cap's rim, in the plane of d and g (the
    objective grows toward g along the sphere): x = c d + sqrt(1 - c^2) u, u = the unit part of g orthogonal to d."""
    d = F.normalize(D, dim=1)
    g = query_sums(Q, owner, len(D))
    g_norm = g.norm(dim=1, keepdim=True)
    g_hat = g / g_norm.clamp_min(NORM_EPS)
    c = max(-1.0, 1.0 - gamma * gamma / 2.0) if gamma != float("inf") else -1.0
    inside = (g_hat * d).sum(1, keepdim=True) >= c  # the unconstrained optimum is within the bound
    ortho = g - (g * d).sum(1, keepdim=True) * d
    ortho_norm = ortho.norm(dim=1, keepdim=True)
    u = ortho / ortho_norm.clamp_min(NORM_EPS)
    rim = c * d + (1.0 - c * c) ** 0.5 * u
    rim = torch.where(ortho_norm > NORM_EPS, rim, d)  # g = -|g| d exactly: every rim point ties; keep d
    out = torch.where(inside, g_hat, rim)
    return torch.where(g_norm > NORM_EPS, out, d)


def median_interval(Q: torch.Tensor, owner: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi), each (n, d): per document and coordinate, the interval of minimisers of sum_i |q_ik - x| (the lower
    and upper medians of its queries' values; equal for an odd count). A document with no query: (nan, nan)."""
    lo = torch.full((n, Q.shape[1]), float("nan"), dtype=Q.dtype, device=Q.device)
    hi = lo.clone()
    order = torch.argsort(owner, stable=True)
    docs, counts = torch.unique_consecutive(owner[order], return_counts=True)
    for size in torch.unique(counts).tolist():  # documents with the same number of queries: one sort each
        which = counts == size
        starts = (torch.cumsum(counts, 0) - counts)[which]
        idx = order[starts[:, None] + torch.arange(size, device=Q.device)]  # (m, size) query rows per document
        values = Q[idx].sort(dim=1).values  # (m, size, d)
        lo[docs[which]] = values[:, (size - 1) // 2]
        hi[docs[which]] = values[:, size // 2]
    return lo, hi


def l1_box(D: torch.Tensor, Q: torch.Tensor, owner: torch.Tensor, gamma: float) -> torch.Tensor:
    """argmin sum_i ||q_i - x||_1 s.t. ||x - d||_inf <= gamma: separable per coordinate into a convex piecewise
    linear sum of |q_ik - x_k| over an interval, minimised by the minimiser nearest d_k (clip d_k into the median
    interval) clipped into [d_k - gamma, d_k + gamma]. Documents without a query are left as they are."""
    lo, hi = median_interval(Q, owner, len(D))
    has = ~torch.isnan(lo[:, :1])
    target = torch.minimum(torch.maximum(D, lo), hi)  # the nearest unconstrained minimiser
    moved = D + (target - D).clamp(-gamma, gamma)
    return torch.where(has, moved, D)


Move = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
# the moves a memory can make: name -> (function, the energy whose objective it maximises exactly)
MOVES: dict[str, tuple[Move, str]] = {"nudge-m": (nudge_m, "dot"), "nudge-n": (nudge_n, "cosine"),
                                      "l1-box": (l1_box, "l1")}


def move(name: str, D: torch.Tensor, Q: torch.Tensor, owner: torch.Tensor, gamma: float) -> torch.Tensor:
    """The move `name` (MOVES) of documents D toward their queries Q, bounded by gamma."""
    if name not in MOVES:
        raise ValueError(f"memory move {name!r}; valid: {sorted(MOVES)}")
    if not gamma >= 0:
        raise ValueError(f"memory strength gamma must be >= 0, got {gamma}")
    return MOVES[name][0](D, Q, owner, gamma)
