"""IR rankings with the lexical channel fused in (heads.scoring.lexical): each query ranks its whole corpus by
the fused score, ties and a query's own text handled as every IR ranking does (heads.kinds.ranking).

The dense scores are minus the head's energies over the whole corpus, a block of queries at a time; the BM25
scores come from an index of the split's document texts. Only the metrics' ranking changes: the run files and the
selection of epochs stay the dense ones.
"""
from __future__ import annotations

import numpy as np
import torch

from headstore.heads.kinds.ranking import IR_TOPK, RANK_BLOCK, IRSplit, ir_metrics_of, ranked_ids
from headstore.heads.scoring.energy import pairwise_energy
from headstore.heads.scoring.ir_metrics import topk_ranking, trec_tie_order
from headstore.heads.scoring.lexical import LEXICAL, fused


def split_texts(split: IRSplit, name: str) -> tuple[list[str], list[str]]:
    """(query texts, document texts) of a split in its order; one clear line where the split has none."""
    if split.texts is None:
        raise ValueError(f"{name}: this split's texts are not at hand (a corpus extended with --unlabeled texts): "
                         "the lexical channel cannot score it; use --no-lexical")
    queries, docs = split.texts["query"], split.texts["document"]
    return [queries[q] for q in split.query_ids], [docs[d] for d in split.doc_ids]


def lexical_scores(split: IRSplit, cfg, name: str) -> torch.Tensor:
    """(Q, N) BM25 scores of the split's queries over its corpus, the index built from the corpus's texts."""
    query_texts, doc_texts = split_texts(split, name)
    _, index_class = LEXICAL[cfg.to_dict()["kind"]]
    return index_class(doc_texts, cfg).scores(query_texts)


def dense_scores(zq: torch.Tensor, zd: torch.Tensor, energy: str) -> torch.Tensor:
    """(Q, N) minus the energies of queries zq (Q, d) against documents zd (N, d), a block of queries at a time."""
    step = max(1, RANK_BLOCK // max(1, len(zd)))
    return torch.cat([-pairwise_energy(energy, zq[s:s + step].float(), zd.float()) for s in range(0, len(zq), step)]
                     or [torch.zeros(0, len(zd))])


FUSED_CHUNK = 64  # queries ranked at a time by `fused_metrics`: (64, N) floats per score matrix, whatever the corpus


def fused_ndcg(split: IRSplit, dense: torch.Tensor, lexical: torch.Tensor, weight: float,
               energy: str) -> tuple[dict, np.ndarray]:
    """(IR metrics, per-query nDCG@10) of the split ranked by the fused score (heads.scoring.lexical.fused)."""
    return fused_metrics(split, lambda s, e: fused(dense[s:e], lexical[s:e], weight), energy)


def fused_metrics(split: IRSplit, scores_of, energy: str) -> tuple[dict, np.ndarray]:
    """(IR metrics, per-query nDCG@10) of the split ranked by `scores_of(start, stop)` -> (stop - start, N) fused
    scores (higher = better), FUSED_CHUNK queries at a time."""
    idx = topk_ranking(lambda s, e: -scores_of(s, e), k=IR_TOPK + int(split.exclude_self),
                       n_queries=len(split.query_ids), chunk_size=FUSED_CHUNK, tie_order=trec_tie_order(split.doc_ids))
    return ir_metrics_of(split, ranked_ids(split, idx, IR_TOPK), energy)
