"""Fitting a document memory (docs/memory.md): the documents judged relevant in training moved toward their
training queries (heads.scoring.nudge), the strength chosen on dev, before the head (on its inputs) or after it.

Once dev has chosen the strength, the memory is fitted again at it on the training and dev judgements together
(dev's judged documents are documents to remember too; on SciFact 0.821 -> 0.846 nDCG@10 for frozen + memory).
The candidates of every strength are scored on dev one after the other (the head's dev documents with the judged
documents' vectors replaced, heads.kinds.ranking.selection_ndcg; never every strength's copy at once); the best dev
nDCG@10 wins, ties to the weaker move, and strength 0 (no edit) is always a candidate, so a memory dev says nothing
for is one that changes nothing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from headstore.heads.evaluation.evaluate import embedder
from headstore.heads.kinds import kind_of
from headstore.heads.kinds.ranking import IRSplit, selection_ndcg
from headstore.heads.scoring.nudge import MOVES, move as apply_move

# chord lengths ||x - d|| on the unit sphere (nudge-n; nudge-m: the change's norm): 0 = no edit, 2 = anywhere
SPHERE_GAMMAS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0, 1.4, 2.0)
# l1-box: quantiles of the coordinate moves to the median (1 = the unconstrained median), so the grid follows the
# head's output scale
BOX_QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
MOVE_FOR = {"features": {"l1": "nudge-n", "l2": "nudge-n", "cosine": "nudge-n"},  # the head's inputs are unit
            "outputs": {"l1": "l1-box", "l2": "nudge-n", "cosine": "nudge-n"}}  # the head's energy's own move


@dataclass
class FittedMemory:
    """The judged documents' edited vectors at the strength dev chose, and the dev curve over strengths."""

    positions: np.ndarray  # (n,) matrix positions of the judged documents (sorted)
    vectors: torch.Tensor  # (n, d) in `space`
    space: str
    move: str
    gamma: float
    curve: list = field(default_factory=list)  # [(gamma, dev nDCG@10)]
    seconds: float = 0.0
    pairs: tuple = ()  # (query positions, document positions) of the judgements the vectors were fitted on
    judgements: str = "train"  # "train", or "train+dev" (refitted on both at the strength dev chose)
    held_out: tuple = ()  # (positions, vectors) fitted on train alone at the chosen strength: what a later choice
    # on dev (the lexical fusion, heads.training.lexical_fit) must use, dev's judgements being in the refit

    def describe(self) -> dict:
        return {"space": self.space, "move": self.move, "gamma": self.gamma, "documents": len(self.positions),
                "judgements": self.judgements,
                "dev_curve": [[g, s] for g, s in self.curve], "fit_seconds": round(self.seconds, 3),
                "rule": "the best dev nDCG@10 over the strengths (fitted on train); ties to the weaker move; 0 = no "
                        "edit; then fitted again on train + dev at that strength"}


def judged_pairs(task) -> tuple[np.ndarray, np.ndarray]:
    """(query positions, document positions) of the training judgements; one clear line where there are none."""
    if task.kind != "ir" or task.train is None or not len(task.train):
        raise ValueError(f"{task.name}: a document memory needs training judgements of an IR dataset (queries with "
                         "relevant documents: qrels/train.tsv or positive pairs); this dataset has none "
                         "(use --no-memory)")
    return np.asarray(task.train.anchor), np.asarray(task.train.positive)


def check_queries_apart(task, queries: np.ndarray, docs: np.ndarray) -> None:
    """A training query whose text is also a judged document (one store row in both roles) would make 'the
    document the memory knows by its text' ambiguous: refused, unless the data is pairs scored as retrieval."""
    splits = [s for s in task.eval_sets.values() if isinstance(s, IRSplit)]
    if splits and all(s.exclude_self for s in splits):
        return
    both = np.intersect1d(queries, docs)
    if len(both):
        raise ValueError(f"{task.name}: {len(both)} training quer{'y is' if len(both) == 1 else 'ies are'} also a "
                         "judged corpus document (the same text in the same role); a memory knows documents by "
                         "their text, so it would edit the query too: drop those queries or use --no-memory")


def strengths(name: str, D: torch.Tensor, Q: torch.Tensor, owner: torch.Tensor) -> list[float]:
    """The strengths tried: the sphere's chord lengths, or for l1-box quantiles of its coordinate moves."""
    if name != "l1-box":
        return list(SPHERE_GAMMAS)
    full = (apply_move(name, D, Q, owner, float("inf")) - D).abs().flatten()
    qs = torch.quantile(full[full > 0][:1 << 24].float(), torch.tensor(BOX_QUANTILES[1:], device=full.device)) if (full > 0).any() else []
    return [0.0, *sorted({float(v) for v in qs})]


def fit_memory(task, features: torch.Tensor, model, norm, energy: str, space: str = "outputs",
               move: str | None = None, negatives=None, precision: str = "fp32", refit: bool = True) -> FittedMemory:
    """The memory of `task`'s training judgements on `features` (norm: the head's normaliser, None where features
    are its inputs already; model None: the frozen features, cosine), strength chosen on task's dev; then, with
    `refit`, fitted again at that strength on the training and dev judgements together (dev has spoken: its
    judgements are more documents to remember, as a model is refitted on train + dev once its settings are chosen).
    `negatives`: the head's NegativesConfig section (exact_max, pool_k: dev on candidates above exact_max, as
    epoch selection ranks it); None: dev whole."""
    t0 = time.perf_counter()
    move = move or MOVE_FOR[space][energy]
    if move not in MOVES:
        raise ValueError(f"memory move {move!r}; valid: {sorted(MOVES)}")
    queries, positives = judged_pairs(task)
    in_space = embedder(model if space == "outputs" else None, features, norm)
    docs, D, Q, owner = _inputs(task, in_space, queries, positives)
    gammas = strengths(move, D, Q, owner)
    candidates = [apply_move(move, D, Q, owner, g) for g in gammas]
    scores = dev_scores(task, features, model, norm, energy, docs, candidates, space, negatives, precision)
    best = int(np.nanargmax(scores)) if np.isfinite(scores).any() else 0
    vectors = candidates[best]
    held_out = (docs, vectors)
    if refit and gammas[best] > 0:  # the strength chosen, the dev judgements join the training ones
        dev_q, dev_d = dev_pairs(task)
        queries, positives = np.concatenate([queries, dev_q]), np.concatenate([positives, dev_d])
        docs, D, Q, owner = _inputs(task, in_space, queries, positives)
        vectors = apply_move(move, D, Q, owner, gammas[best])
    return FittedMemory(docs, vectors.contiguous(), space, move, gammas[best],
                        [(float(g), float(s)) for g, s in zip(gammas, scores)], time.perf_counter() - t0,
                        (queries, positives), "train+dev" if refit and gammas[best] > 0 else "train", held_out)


def _inputs(task, in_space, queries: np.ndarray, positives: np.ndarray):
    """(documents (sorted unique), their vectors D, the queries' vectors Q, each query's row of D)."""
    docs = np.unique(positives)
    check_queries_apart(task, queries, docs)
    owner = torch.as_tensor(np.searchsorted(docs, positives))
    return docs, in_space(docs, "document")[0].float(), in_space(queries, "query")[0].float(), owner


def dev_pairs(task) -> tuple[np.ndarray, np.ndarray]:
    """(query positions, document positions) of the dev split's relevant judgements (grade > 0)."""
    dev: IRSplit = task.eval_sets["dev"]
    row = dict(zip(dev.doc_ids, np.asarray(dev.doc_rows).tolist()))
    pairs = [(int(q), row[d]) for qid, q in zip(dev.query_ids, np.asarray(dev.query_rows))
             for d, g in dev.qrels.get(qid, {}).items() if g > 0 and d in row]
    return (np.array([q for q, _ in pairs], dtype=np.int64).reshape(-1),
            np.array([d for _, d in pairs], dtype=np.int64).reshape(-1))


@torch.no_grad()
def dev_scores(task, features, model, norm, energy, docs, candidates, space, negatives, precision) -> np.ndarray:
    """(G,) dev nDCG@10 of the head with each candidate's judged documents (all strengths in one ranking pass)."""
    if "dev" not in task.eval_sets:
        raise ValueError(f"{task.name}: no dev split to choose the memory's strength on")
    dev = task.eval_sets["dev"]
    if negatives is not None:  # a large corpus: dev cut to its candidates, as epoch selection ranks it
        dev, _ = kind_of(task).selection_set(task, "dev", features, negatives)
    embed = embedder(model, features, norm)
    zq, zd = embed(dev.query_rows, "query").float()[:1], embed(dev.doc_rows, "document").float()[:1]  # (1, Q|N, d)
    where = {int(r): j for j, r in enumerate(np.asarray(dev.doc_rows))}
    hit = np.array([j for j, r in enumerate(docs) if int(r) in where], dtype=np.int64)
    cols = torch.as_tensor([where[int(docs[j])] for j in hit], dtype=torch.long)
    scores = []
    for cand in candidates:  # one strength at a time: a (G, N, d) stack of them and its ranking's blocks of
        # (heads, queries, candidates, d) took 0.8 GB on a 1M-document corpus's dev candidates (G = 11)
        edited = cand[torch.as_tensor(hit)]
        if space == "features" and model is not None:
            edited = model.eval().encode(edited, "document")[0] if len(hit) else edited
        one = zd.clone()
        one[0, cols] = edited.to(one.dtype)
        scores += selection_ndcg(dev, zq, one, energy, precision)
    return np.asarray(scores)
