"""Evaluators: a split of a task + embeddings -> `dict[str, float]` with sentence-transformers/MTEB names.

Names are prefixed by the similarity used: `manhattan` (L1 energy), `euclidean` (L2), `cosine`:
`manhattan_ndcg@10`, `cosine_mrr@10`, `spearman_manhattan`, `manhattan_auc`, ... Every evaluator works
on a stack of H heads at once and returns one dict per head; what is measured is the task kind's
(heads.kinds). The frozen baseline is the same evaluator run on the raw stored features (a stack of one
"identity head") with cosine and with L1.
"""
from __future__ import annotations

import numpy as np
import torch

from headstore.heads.kinds import PREFIX, Task, kind_of, primary_metric  # noqa: F401  (PREFIX re-exported)
from headstore.heads.kinds.base import Embed
from headstore.heads.kinds.seen import parts_block

EMBED_BATCH = 8192  # rows per forward pass when embedding a split; bounds memory, not results
TEST_SPLIT = "test"


def embed_rows(model: torch.nn.Module | None, features: torch.Tensor, rows: np.ndarray,
               role: str = "query", norm=None) -> torch.Tensor:
    """Head outputs of store rows holding texts in `role`, (H, n, d); `model=None` is the frozen baseline,
    (1, n, D). A query-side head gives documents their features unchanged (heads.network.model.StackedMLP.encode).
    norm: a Normalizer applied to the rows read (row by row: the numbers of norm(features)[rows], without a
    normalised copy of every feature)."""
    idx = torch.as_tensor(np.asarray(rows), dtype=torch.long)
    if norm is not None:
        features = _Normalized(features, norm)
    if model is None:
        return features[idx].unsqueeze(0)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        if role == "document" and getattr(model, "cfg", None) is not None and model.cfg.sides == "query":
            out = model.encode(features[idx], role)  # the rows themselves, one copy shared by every head
        else:  # filled batch by batch: the outputs once, never a list of parts and their concatenation
            first = model.encode(features[idx[:EMBED_BATCH]], role)  # (H, b, d)
            out = first.new_empty((first.shape[0], len(idx), first.shape[2]))
            out[:, :first.shape[1]] = first
            for s in range(EMBED_BATCH, len(idx), EMBED_BATCH):
                out[:, s:s + EMBED_BATCH] = model.encode(features[idx[s:s + EMBED_BATCH]], role)
    model.train(was_training)
    return out


def embedder(model: torch.nn.Module | None, features: torch.Tensor, norm=None) -> Embed:
    """The `Embed` of a stack over `features` (normalised row by row by `norm` when given): (store rows, role)
    -> (H, n, d) (`embed_rows`)."""
    return lambda rows, role="query": embed_rows(model, features, rows, role, norm)


class _Normalized:
    """features[idx] -> norm(features[idx]): the rows a head reads, normalised as they are read."""

    def __init__(self, features: torch.Tensor, norm):
        self.features, self.norm = features, norm

    def __getitem__(self, idx) -> torch.Tensor:
        return self.norm(self.features[idx])


def evaluate_split(task: Task, split: str, embed: Embed, energies: tuple[str, ...]) -> tuple[list[dict], list[dict]]:
    """Metrics of every head on one split, for each energy in `energies`.

    Returns (metrics per head, per-item values per head for bootstrap CIs, keyed by energy prefix)."""
    return kind_of(task).evaluate(task, split, embed, energies)


def selection_scores(task: Task, split: str, embed: Embed, energy: str, precision: str = "fp32") -> list[float]:
    """The primary metric of every head on `split`: what training selects epochs on, once per epoch (one pass
    for all heads; a head whose outputs are not finite scores NaN)."""
    return kind_of(task).selection_scores(task, split, embed, energy, precision)


def evaluate_baseline(task: Task, features: torch.Tensor, splits: tuple[str, ...], dim: int | None = None) -> dict:
    """The frozen baseline of every split present: {split: (metrics under cosine and L1, per-item values)}.

    dim: the store's feature dim when `features` holds several arrays side by side (a mixing head): the
    frozen baseline is the first array (the last layer) alone."""
    base_features = features if dim is None else features[:, :dim]
    present = tuple(s for s in splits if s in task.eval_sets)
    scored = kind_of(task).evaluate_splits(task, present, embedder(None, base_features), ("cosine", "l1"))
    return {split: (base[0], base_items[0]) for split, (base, base_items) in scored.items()}


def evaluate_head(task: Task, features: torch.Tensor, model, norm, energy: str, splits: tuple[str, ...],
                  dim: int | None = None, baseline: dict | None = None, rankings: dict | None = None,
                  items: dict | None = None, seen: dict | None = None) -> dict:
    """metrics.json content for the splits present: baseline and head, with CIs of the primary metric.

    dim: as `evaluate_baseline`'s. baseline: `evaluate_baseline`'s result when it was scored already (train-head
    scores it before training normalises the features in place; `features` and norm=None are the head's inputs).
    rankings: filled with the head's rankings where the kind keeps them (run files then rank nothing again).
    items: filled with {split: {"baseline": cosine per-item values, "head": the head's}} (what the CIs resample).
    seen: {split: seen mask} (heads.kinds.seen_masks): each such split's primary metric also on its seen and unseen
    queries and all, under "parts" (heads.kinds.seen.parts_block), and a warning where every query is seen."""
    kind = kind_of(task)
    if baseline is None:
        baseline = evaluate_baseline(task, features, splits, dim)
    out: dict = {"primary": kind.primary_metric(energy), "baseline_primary": kind.primary_metric("cosine"),
                 "ci": {}, "n_scored": {}}
    energies = (energy,) if energy == "cosine" else (energy, "cosine")
    present = tuple(s for s in splits if s in task.eval_sets)
    scored = kind.evaluate_splits(task, present, embedder(model, features, norm), energies, rankings)
    for split in present:
        base, base_items = baseline[split]
        head, head_items = scored[split]
        block = {"baseline": base, "head": head[0]}
        out.setdefault("warnings", []).extend(kind.warnings(task, split))  # metrics.json and the terminal table
        out["n_scored"][split] = kind.n_items(task.eval_sets[split])  # queries, pairs or texts
        ci = {"baseline": kind.ci(task, split, base_items["cosine"]),
              "head": kind.ci(task, split, head_items[0][PREFIX[energy]])}
        if seen and split in seen:
            block["parts"] = parts_block(base_items["cosine"], head_items[0][PREFIX[energy]], seen[split], split)
            if not block["parts"]["unseen"]["n"] and block["parts"]["all"]["n"]:  # training judged every query's
                out["warnings"].append(f"{task.name}: {block['parts']['note']}")  # document: said in one line
        if items is not None:
            items[split] = {"baseline": base_items["cosine"], "head": head_items[0][PREFIX[energy]]}
        if split == TEST_SPLIT:
            out.update(block)
            out["ci"] = ci
        else:
            out[split] = block | {"ci": ci}
    if not out.get("warnings"):
        out.pop("warnings", None)
    return out
