"""`cli finetune`'s dev scoring and early stopping: the head's dev metric with the TRAINING encoder, cheaply.

Dev is scored at the starting point (epoch 0) and after every epoch, by the task kind's own selection code
(heads.evaluation.evaluate.selection_scores: what train-head selects its epochs on), the head's primary
metric under its eval energy. Its rows are encoded on the fly through the encoder being trained
(finetune_negatives.RowEncoder.frozen: eval mode, no grad, the store's pooling and numerics), the saved
Normalizer and the head: never a full store per epoch.

What is encoded (`dev_task`): pairs kinds (STS, labelled pairs) the dev pairs' texts only; labelled texts
their dev texts and the labelled reference they are matched against (as train-head scores them); an IR
split its dev queries against a FIXED corpus subsample: every document judged for a dev query plus
`dev_docs` others drawn with kinds.base.DEV_SEED, the same for every epoch, setup and seed (so dev
figures compare across them; a subsample's nDCG@10 is higher than the whole corpus's, and means only that).

`BestState` keeps the best epoch's trainable state (encoder trainables + head) in memory and stops after
`patience` epochs without a dev improvement; the starting point is a candidate, as train-head's guard.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import time

import numpy as np
import torch

from headstore.heads.evaluation.evaluate import selection_scores
from headstore.heads.kinds import kind_of
from headstore.heads.kinds.base import DEV_SEED
from headstore.heads.kinds.ranking import IRSplit
from headstore.heads.network.model import autocast

DEV_SPLIT = "dev"


def dev_task(task, dev_docs: int, seed: int = DEV_SEED):
    """`task` with only its dev split, an IR dev split's corpus cut to its judged documents + `dev_docs`
    others (module doc); None when the task has no dev split."""
    data = task.eval_sets.get(DEV_SPLIT)
    if data is None:
        return None
    if isinstance(data, IRSplit):
        data = ir_subsample(data, dev_docs, seed)
    return dataclasses.replace(task, eval_sets={DEV_SPLIT: data})


def ir_subsample(data: IRSplit, dev_docs: int, seed: int = DEV_SEED) -> IRSplit:
    """`data` ranked against every document judged for one of its queries plus `dev_docs` others drawn without
    replacement (numpy, `seed`); the corpus order kept. The whole corpus when that is no smaller."""
    judged = {d for q in data.query_ids for d in data.qrels.get(q, {})}
    is_judged = np.array([d in judged for d in data.doc_ids], dtype=bool)
    others = np.flatnonzero(~is_judged)
    if len(others) <= dev_docs:
        return data
    keep = is_judged.copy()
    keep[np.random.default_rng(seed).choice(others, size=dev_docs, replace=False)] = True
    at = np.flatnonzero(keep)
    return IRSplit(data.query_ids, data.query_rows, [data.doc_ids[i] for i in at], data.doc_rows[at],
                   data.qrels, data.exclude_self, data.texts)


class DevScorer:
    """The dev figure of the training encoder + head: `()` -> float (NaN when the outputs are not finite)."""

    def __init__(self, task, encoder, norm, head, energy: str, precision: str):
        self.task, self.encoder, self.norm, self.head = task, encoder, norm, head
        self.energy, self.precision = energy, precision
        self.metric = kind_of(task).primary_metric(energy)
        self.seconds: list[float] = []

    def embed(self, rows, role: str = "query") -> torch.Tensor:  # (n,) store rows -> (1, n, d)
        pooled = self.encoder.frozen(rows)
        with torch.no_grad(), autocast(self.precision, pooled.device):
            return self.head.encode(self.norm(pooled), role).float()

    def describe(self) -> dict:
        """What each scoring encodes (finetune.json "dev_set"): items, store rows, an IR corpus subsample's size
        and a hash of its document ids (the same for every run of a dataset and dev_docs)."""
        data, kind = self.task.eval_sets[DEV_SPLIT], kind_of(self.task)
        out = {"metric": self.metric, "items": kind.n_items(data), "rows": len(kind.rows(data))}
        if isinstance(data, IRSplit):
            out["documents"] = len(data.doc_ids)
            out["documents_sha1"] = hashlib.sha1("\n".join(data.doc_ids).encode()).hexdigest()[:12]
        return out

    def __call__(self) -> float:
        t0 = time.perf_counter()
        was_training = self.head.training
        self.head.eval()
        try:
            value = selection_scores(self.task, DEV_SPLIT, self.embed, self.energy, self.precision)[0]
        finally:
            self.head.train(was_training)
        self.seconds.append(time.perf_counter() - t0)
        return float(value)


class BestState:
    """The dev curve, the best epoch's trainable tensors (a copy in memory) and patience."""

    def __init__(self, params: list[torch.Tensor], patience: int):
        self.params, self.patience = params, patience
        self.best_value, self.best_epoch, self.stale = -math.inf, -1, 0
        self.best = [p.detach().clone() for p in params]
        self.curve: list[dict] = []

    def record(self, epoch: int, value: float, loss: float | None = None) -> None:
        """Epoch `epoch`'s dev figure (0: the starting point); a better one is kept, another counts as stale.
        A NaN figure is never better (its weights are never kept)."""
        self.curve.append({"epoch": epoch, "dev": value, **({} if loss is None else {"loss": loss})})
        if math.isfinite(value) and value > self.best_value:
            self.best_value, self.best_epoch, self.stale = value, epoch, 0
            for b, p in zip(self.best, self.params):
                b.copy_(p.detach())
        elif epoch > 0:
            self.stale += 1

    @property
    def exhausted(self) -> bool:
        return self.stale >= self.patience

    def state(self, epoch: int) -> dict:
        """What `load` takes back (finetune_resume) after epoch `epoch`: the curve, patience and the kept tensors,
        left out when they are the current ones (kept at this epoch) or never used (no finite figure yet)."""
        kept = None if self.best_epoch in (epoch, -1) else [b.detach().cpu() for b in self.best]
        return {"curve": self.curve, "best_value": self.best_value, "best_epoch": self.best_epoch,
                "stale": self.stale, "best": kept}

    def load(self, state: dict) -> None:
        """As `state` left it; the current trainable tensors must already be the checkpoint's."""
        self.curve = list(state["curve"])
        self.best_value, self.best_epoch, self.stale = state["best_value"], state["best_epoch"], state["stale"]
        with torch.no_grad():
            for i, (b, p) in enumerate(zip(self.best, self.params)):
                b.copy_(p.detach() if state["best"] is None else state["best"][i])

    def restore(self) -> None:
        """Every trainable tensor set to the best epoch's (the last state when no figure was finite)."""
        if self.best_epoch < 0:
            return
        with torch.no_grad():
            for p, b in zip(self.params, self.best):
                p.copy_(b)
