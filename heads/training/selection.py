"""Selection that respects out-of-domain quality, on dev splits only (`--select-ood D`, `--ood-delta`).

Every candidate (a head's epoch in training, a configuration in a grid) has its in-domain dev metric and,
for each out-of-domain selection set D, its *out-of-domain dev loss*: the frozen baseline's metric on D
(the stored features with cosine: what the user has without a head) minus the candidate's. The rule:
the best in-domain dev candidate whose worst out-of-domain dev loss is <= delta (default 0.01); when no
candidate keeps within delta, the least-losing one (`rule_key`).

Only dev splits are ever selected on: D's `dev` split, or, when D has none, its `train` split (a part of D
that is never reported); never a test split. A dataset with neither is refused. Items of D that share a
text with the in-domain dataset or its --unlabeled texts are dropped (counted per source), as for `--transfer`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from headstore.heads.artefacts.files import rule_key  # noqa: F401 (the rule's sort key lives with the grid ranking it orders)
from headstore.heads.evaluation.evaluate import embedder, evaluate_split
from headstore.heads.kinds import Task, kind_of, load_task, primary_metric, seen_rows, without_seen

DEFAULT_DELTA = 0.01  # the tolerance: an out-of-domain loss of at most 1 point of the metric
SELECT_SPLITS = ("dev", "train")  # in this order; test is never selected on


def selection_split(task: Task, path: str) -> str:
    """The split of an out-of-domain dataset that selection may use: dev, else train (never test)."""
    for split in SELECT_SPLITS:
        if split in task.eval_sets:
            return split
    raise ValueError(f"{path}: no dev or train split to select on (splits: {', '.join(sorted(task.eval_sets))}); "
                     "a test split is never selected on (give it to --transfer to report it)")


@dataclass
class OodSelection:
    """The out-of-domain selection sets, the frozen baseline on each, and the tolerance."""

    sets: dict[str, tuple[Task, str]] = field(default_factory=dict)  # name -> (task, split)
    frozen: dict[str, float] = field(default_factory=dict)  # name -> frozen cosine metric on its split
    delta: float = DEFAULT_DELTA
    dropped: dict[str, dict] = field(default_factory=dict)  # name -> items dropped for sharing a text

    def __bool__(self) -> bool:
        return bool(self.sets)

    def losses(self, embed: Callable[[np.ndarray], torch.Tensor], energy: str) -> tuple[np.ndarray, dict]:
        """(H,) worst out-of-domain dev loss of every head, and {name: (H,) metric}."""
        per_set = {}
        for name, (task, split) in self.sets.items():
            res, _ = evaluate_split(task, split, embed, (energy,))
            per_set[name] = np.array([r[primary_metric(task.kind, energy)] for r in res])
        worst = np.max([self.frozen[n] - v for n, v in per_set.items()], axis=0)  # (H,)
        return worst, per_set

    def describe(self) -> dict:
        """What metrics.json / a grid records about the rule."""
        return {"rule": f"best in-domain dev whose worst out-of-domain dev loss (frozen cosine minus head) is "
                        f"<= {self.delta}, else the least-losing", "delta": self.delta,
                "sets": {n: {"split": s, "frozen_cosine": self.frozen[n], "evaluation": t.evaluation,
                             **({"dropped": self.dropped[n]} if n in self.dropped else {})}
                         for n, (t, s) in self.sets.items()}}


def load_selection(store, paths: tuple[str, ...], in_domain: Task, features: torch.Tensor,
                   delta: float = DEFAULT_DELTA, remap=None, data: str | None = None) -> OodSelection:
    """The selection sets of `paths` (their dev or train split, in-domain texts dropped) and the frozen
    baseline on each, from `features` (N, D) raw stored features (the last layer). `remap`: store rows ->
    positions of `features` when it holds only some rows (heads.artefacts.task_features.TaskFeatures.remap).
    `data`: how the user named the in-domain dataset ("--data FILE"), for the lines on what a set lost."""
    if not (math.isfinite(delta) and delta >= 0):
        raise ValueError(f"ood delta must be a finite number >= 0 (a loss of the metric), got {delta}")
    sel = OodSelection(delta=delta)
    seen = seen_rows(in_domain, data or in_domain.name)  # its texts and its --unlabeled texts: the heads train on them
    for path in paths:
        task = load_task(path, store, for_eval=True)
        task = remap(task) if remap is not None else task
        split = selection_split(task, path)
        task, dropped = without_seen(task, seen, f"--select-ood {path}", lambda t: split)
        if kind_of(task).n_items(task.eval_sets[split]) < 2:
            raise ValueError(f"{path}: its {split} split shares (almost) every text with {in_domain.name}; an "
                             "out-of-domain selection set must be another dataset")
        name = task.name if task.name not in sel.sets else f"{task.name}-{len(sel.sets)}"
        if dropped:
            sel.dropped[name] = dropped
        res, _ = evaluate_split(task, split, embedder(None, features), ("cosine",))
        sel.sets[name] = (task, split)
        sel.frozen[name] = res[0][primary_metric(task.kind, "cosine")]
    return sel
