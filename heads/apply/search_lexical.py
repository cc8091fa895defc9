"""`cli index` / `cli search` with a head's lexical channel (lexical.json, heads.training.lexical_fit): BM25 over the
indexed texts saved beside the FAISS index, and each query ranked by the fused score of eval
(heads.scoring.lexical) over the union of both channels' top candidates.

IDX/lexical/: `bm25/` (bm25s's index of the items' texts, in the items' order), `lexical.json` (the head's weight
for this corpus: `weight_new` where the training judged none of its items, as eval; the memory's gain, BM25's
settings) and, where the gain is not 1, `plain.safetensors` (the memory's documents' vectors without its edit: the
gain scales the edit's change of score). A query's candidates are its CANDIDATES nearest items by the head and its
CANDIDATES best by BM25; their dense scores are computed again from the index's vectors, each channel is scaled by
the query's spread over the same documents eval measures it on, and the union is ranked by the fused score. On a
corpus of at most CANDIDATES items the ranking is eval's, item for item.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from headstore.data.files import atomic_write_json
from headstore.heads.scoring.energy import pairwise_energy
from headstore.heads.scoring.lexical import Bm25Index, fused as fuse, gained, scale_columns
from headstore.heads.training.lexical_fit import LEXICAL_FILE, applied_weight, load as load_lexical

LEXICAL_DIR = "lexical"
CANDIDATES = 100  # each channel's candidates per query (at least k): the fused ranking is over their union
PLAIN_FILE = "plain.safetensors"


def build(out: Path, head_ref: str, head, texts: list[str], text_ids: list[str], judged: int | None,
          plain_of) -> dict | None:
    """IDX/lexical/ where the head's folder has a lexical.json (None: it has none), at the weight for a corpus
    holding `judged` of the documents the head's training judged (None: not known; lexical_fit.applied_weight);
    `plain_of(positions)` -> the items' vectors as indexed without the memory (n, d), for the memory's gain."""
    saved = load_lexical(head_ref, "auto") if Path(head_ref).is_dir() else None
    if saved is None:
        return None
    d = out / LEXICAL_DIR
    d.mkdir(parents=True, exist_ok=True)
    Bm25Index(texts, saved["bm25"]).save(d / "bm25")
    known = [] if head.memory is None else np.flatnonzero(np.isin(np.asarray(text_ids), list(head.memory.text_ids)))
    settings = {**{k: v for k, v in saved.items() if k != "bm25"}, "weight": applied_weight(saved, judged),
                "weight_dev": saved["weight"]}  # this corpus's weight (eval's rule: lexical_fit.applied_weight)
    if saved["gain"] != 1.0 and len(known):
        from safetensors.torch import save_file

        save_file({"positions": torch.as_tensor(known, dtype=torch.int64),
                   "vectors": torch.as_tensor(plain_of(known), dtype=torch.float32).contiguous()}, str(d / PLAIN_FILE))
    atomic_write_json(d / LEXICAL_FILE, settings, sort_keys=True)
    return {"weight": settings["weight"], "gain": settings["gain"], "candidates": CANDIDATES,
            "memory_documents": len(known), "judged_documents": judged}


class FusedRanker:
    """The fused ranking of an index directory's items (`rank`), built on its SearchIndex's vectors."""

    def __init__(self, index_dir: Path, search_index):
        d = Path(index_dir) / LEXICAL_DIR
        saved = load_lexical(str(d), "on", fix="rebuild the index with `cli index`, or search with --no-lexical")
        self.weight, self.gain, self.index = saved["weight"], saved["gain"], search_index
        self.n = search_index.index.ntotal
        self.bm25 = Bm25Index.load(d / "bm25", saved["bm25"], self.n)
        self.plain: dict[int, np.ndarray] = {}
        if (d / PLAIN_FILE).is_file():
            from safetensors.torch import load_file

            t = load_file(str(d / PLAIN_FILE))
            self.plain = dict(zip(t["positions"].tolist(), t["vectors"].numpy()))
        self.sample = scale_columns(self.n)
        self.sample_vectors = search_index.index.reconstruct_batch(self.sample)  # each query's spread is measured on

    def dense(self, query: np.ndarray, positions: np.ndarray, vectors: np.ndarray | None = None) -> np.ndarray:
        """(m,) minus the head's energies of one prepared query vector to the items at `positions` (their indexed
        `vectors`, read from the index where not given), the memory's change of score scaled by its gain (as eval
        scales it: heads.training.lexical_fit.split_items)."""
        energy = self.index.info["energy"]
        if vectors is None:
            vectors = self.index.index.reconstruct_batch(np.asarray(positions, dtype=np.int64))
        q = torch.as_tensor(query[None], dtype=torch.float32)
        score = -pairwise_energy(energy, q, torch.as_tensor(vectors))[0].numpy()
        mine = [j for j, p in enumerate(positions) if int(p) in self.plain]
        if mine and self.gain != 1.0:
            plain = np.stack([self.plain[int(positions[j])] for j in mine])
            before = -pairwise_energy(energy, q, torch.as_tensor(plain))[0].numpy()
            score[mine] = gained(before, score[mine], self.gain)
        return score

    def rank(self, query_texts: list[str], vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(positions (Q, k), fused scores (Q, k)), best first (-1 / NaN where fewer items)."""
        want = min(self.n, max(k, CANDIDATES))
        nearest, _ = self.index.search_vectors(vectors, want)
        pos, val = np.full((len(vectors), k), -1, np.int64), np.full((len(vectors), k), np.nan)
        for i, q in enumerate(vectors):
            lexical = self.bm25.scores(query_texts[i:i + 1]).numpy()[0]  # (N,): one query's at a time
            best = np.argsort(-lexical, kind="stable")[:want]
            cand = np.union1d(nearest[i][nearest[i] >= 0], best)
            spreads = [torch.tensor([[float(x.std(ddof=1))]]) for x in
                       (self.dense(q, self.sample, self.sample_vectors), lexical[self.sample])]  # as eval's
            fused = fuse(torch.as_tensor(self.dense(q, cand))[None], torch.as_tensor(lexical[cand])[None],
                         self.weight, *spreads)[0].numpy()  # (m,) the candidates' fused scores
            order = np.lexsort((cand, -fused))[:k]
            pos[i, :len(order)], val[i, :len(order)] = cand[order], fused[order]
        return pos, val
