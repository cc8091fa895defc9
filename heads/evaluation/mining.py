"""Hard negatives: exact nearest neighbours of each training anchor over the stored corpus.

Mined once in the feature space (cosine over the stored features), or re-mined each epoch in each
head's own space with its own energy. Known positives of the anchor are never returned.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from headstore.heads.network.candidates import pooled_negatives
from headstore.heads.scoring.energy import pairwise_energy
from headstore.heads.scoring.ir_metrics import topk_ranking

CHUNK = 512  # anchors per block of the (chunk, N) energy matrix


@dataclass(frozen=True)
class MiningPlan:
    """What mining needs that does not change between epochs: the corpus's store rows (unique, ascending),
    the unique anchors and where each pair's anchor is among them, each unique anchor's positives (as corpus
    indices, never mined) and k. Built once per training (a 1M-document corpus: 0.5 s per epoch otherwise)."""

    corpus_rows: np.ndarray  # (M,) int64 store rows
    anchors: np.ndarray  # (U,) unique anchor store rows
    inverse: np.ndarray  # (P,) position of each pair's anchor in `anchors`
    exclude: list[list[int]]  # per unique anchor: corpus indices of its positives
    k: int

    @classmethod
    def build(cls, anchors: np.ndarray, corpus_rows: np.ndarray, relevant: set[tuple[int, int]], k: int) -> "MiningPlan":
        corpus_rows = np.unique(np.asarray(corpus_rows, dtype=np.int64))
        uniq, inverse = np.unique(anchors, return_inverse=True)
        positives: dict[int, set[int]] = {}
        pairs = np.array(sorted(relevant), dtype=np.int64).reshape(-1, 2)  # (R, 2) anchor, positive store rows
        at = np.minimum(np.searchsorted(corpus_rows, pairs[:, 1]), max(len(corpus_rows) - 1, 0))
        inside = corpus_rows[at] == pairs[:, 1] if len(corpus_rows) else np.zeros(len(pairs), dtype=bool)
        for a, i in zip(pairs[inside, 0].tolist(), at[inside].tolist()):  # positives in the corpus, as its indices
            positives.setdefault(a, set()).add(i)
        exclude = [sorted(positives.get(int(a), ())) for a in uniq]
        extra = max((len(e) for e in exclude), default=0)
        if min(k, len(corpus_rows) - extra) < k:
            raise ValueError(f"cannot mine {k} negatives from a corpus of {len(corpus_rows)} documents")
        return cls(corpus_rows, uniq, inverse, exclude, k)


def mine_negatives(features: torch.Tensor, anchors: np.ndarray, corpus_rows: np.ndarray,
                   relevant: set[tuple[int, int]], k: int,
                   embed: Optional[Callable[[np.ndarray], torch.Tensor]] = None, n_heads: int = 1,
                   energy: str = "cosine", pool: Optional[np.ndarray] = None) -> torch.Tensor:
    """Store rows of the k lowest-energy corpus documents of each anchor that are not its positives.

    features (N, D); anchors (P,) store rows; corpus_rows (M,) store rows. With `embed` (rows ->
    (H, n, d)) the search runs in each head's space; otherwise once in feature space, shared by all
    n_heads. Returns (H, P, k) int64 store rows.

    pool: (U, c) indices into the sorted unique corpus rows, the candidates of each unique anchor (sorted
    ascending; heads.network.candidates.frozen_topk): only they are scored. None scans the whole corpus (exact).

    Documents are store rows, i.e. texts: a document listed twice in the corpus (two ids, one text) is one
    candidate, so a duplicate of an anchor's positive is never mined as that anchor's negative."""
    return mine(MiningPlan.build(anchors, corpus_rows, relevant, k), features, embed, n_heads, energy, pool)


def mine(plan: MiningPlan, features: torch.Tensor, embed: Optional[Callable[[np.ndarray], torch.Tensor]] = None,
         n_heads: int = 1, energy: str = "cosine", pool: Optional[np.ndarray] = None) -> torch.Tensor:
    """mine_negatives on a plan made once (MiningPlan.build): (H, P, k) store rows."""
    corpus_t = torch.as_tensor(plan.corpus_rows)
    if pool is not None:
        return _mine_pool(features, plan, corpus_t, pool, embed, n_heads, energy)
    if embed is None:
        spaces = [(features[torch.as_tensor(plan.anchors)], features[corpus_t])]
        energy = "cosine"
    else:
        za, zd = embed(plan.anchors, "query"), embed(plan.corpus_rows, "document")  # (H, U, d), (H, M, d)
        spaces = [(za[h], zd[h]) for h in range(za.shape[0])]
    out = []
    for q, d in spaces:
        idx = topk_ranking(lambda s, e: pairwise_energy(energy, q[s:e], d), k=plan.k, n_queries=len(plan.anchors),
                           chunk_size=CHUNK, exclude=plan.exclude)  # (U, k) corpus positions
        out.append(corpus_t[idx][torch.as_tensor(plan.inverse)])  # (P, k) store rows
    mined = torch.stack(out)  # (H or 1, P, k)
    return mined.expand(n_heads, -1, -1) if mined.shape[0] == 1 else mined


def _mine_pool(features, plan: MiningPlan, corpus_t, pool, embed, n_heads, energy) -> torch.Tensor:
    """mine_negatives on each anchor's candidate pool only: in feature space by cosine (embed None, shared by
    all heads) or in each head's space; documents embedded one block of anchors' pools at a time."""
    if embed is None:
        za, energy = features[torch.as_tensor(plan.anchors)].unsqueeze(0), "cosine"  # (1, U, D)
        zd_of = lambda d: features[corpus_t[torch.as_tensor(d)]].unsqueeze(0)  # noqa: E731
    else:
        za = embed(plan.anchors, "query")  # (H, U, d)
        zd_of = lambda d: embed(corpus_t[torch.as_tensor(d)].numpy(), "document")  # noqa: E731
    mined = pooled_negatives(za, zd_of, pool, plan.k, plan.exclude, energy)  # (H|1, U, k) corpus indices
    mined = corpus_t[mined][:, torch.as_tensor(plan.inverse)]  # (H|1, P, k) store rows
    return mined.expand(n_heads, -1, -1) if mined.shape[0] == 1 else mined
