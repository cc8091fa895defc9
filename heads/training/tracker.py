"""Selection during training: every head's dev score per epoch, early stopping, and the best weights
under the selection rule (heads.training.selection's `rule_key`), the starting point a candidate (the guard)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

import torch

from headstore.heads.settings.config import TrainConfig
from headstore.heads.evaluation.evaluate import embed_rows, selection_scores
from headstore.heads.kinds import Task
from headstore.heads.network.model import StackedMLP, autocast
from headstore.heads.training.selection import rule_key


@dataclass
class HeadRun:
    """What training one head produced."""

    config: TrainConfig
    status: str = "ok"  # ok | failed
    reason: str = ""
    best_epoch: int = -1  # 0: the starting point (guard) was kept
    best_step: int = -1  # the training step of the kept weights (0: the starting point)
    stopped_step: Optional[int] = None  # the step early stopping ended the head's training at (None: it ran out)
    scoring: dict = field(default_factory=dict)  # how dev was scored and early stopping counted (train.scoring_report)
    best_dev: float = float("nan")
    history: list[dict] = field(default_factory=list)  # per epoch: loss, dev metric
    seconds: float = 0.0
    start_dev: float = float("nan")  # the dev metric of the starting point (before any update)
    best_sel_loss: Optional[float] = None  # out-of-domain dev loss of the kept weights (--select-ood)
    strength: float = 1.0  # the strength a applied after training (heads.training.strength)
    strength_curve: list[dict] = field(default_factory=list)  # dev (and OOD dev) per a, when a was scored
    negatives: dict = field(default_factory=dict)  # how hard negatives were mined (metrics.json "negatives")
    anchor: dict = field(default_factory=dict)  # the anchor regulariser's sample (metrics.json "anchor")
    dev_candidates: dict = field(default_factory=dict)  # how the per-epoch dev set was made (IR: exact / candidates)
    select_set: object = None  # the evaluation set selected on each epoch (IR above exact_max: the candidates)


def dev_scores(task: Task, split: str, model: StackedMLP, X: torch.Tensor, energy: str,
               precision: str = "fp32") -> list[float]:
    """The selection metric of every head on `split` under `energy` (NaN for a head whose outputs are not
    finite): one pass for all heads (heads.evaluation.evaluate.selection_scores), the embeddings in `precision`."""
    def embed(rows, role="query"):
        with autocast(precision, X.device):
            return embed_rows(model, X, rows, role).float()

    return selection_scores(task, split, embed, energy, precision)


class HeadTracker:
    """Per head across epochs: failure, early stopping on the dev score, and the best-scoring weights.

    `alive[h]`: still training; `ok[h]`: not failed. `end_epoch` records an epoch (loss and score per head)
    and keeps head h's weights when it beats its best so far under the selection rule (heads.training.selection's
    `rule_key`: the dev score alone, or with out-of-domain dev losses the best dev within delta, else the
    least-losing); `patience` epochs without that stop it. `start` makes the starting point (epoch 0) the
    first candidate (the guard)."""

    def __init__(self, configs: Sequence[TrainConfig], params: list[torch.Tensor], patience: int,
                 delta: float = 0.0):
        H = len(configs)
        self.runs = [HeadRun(c) for c in configs]
        self.params, self.patience, self.delta = params, patience, delta  # params: the whole stack's (restore_best)
        self.source, self.rows = params, list(range(H))  # head h's current weights: row rows[h] of source (follow)
        self.alive = torch.ones(H, dtype=torch.bool)
        self.ok = torch.ones(H, dtype=torch.bool)
        self.best: list[tuple] = [(-math.inf,)] * H  # rule_key of the kept weights
        self.stale = torch.zeros(H, dtype=torch.long)
        self.best_state = [p.detach().clone() for p in params]

    def start(self, scores: list[float], sel_losses: Optional[list[float]], guard: bool) -> None:
        """Record the starting point's dev scores; with `guard` its weights (already kept) are a candidate."""
        for h, value in enumerate(scores):
            run = self.runs[h]
            run.start_dev = value
            if guard and math.isfinite(value):
                loss = None if sel_losses is None else sel_losses[h]
                self.best[h] = rule_key(value, loss, self.delta)
                run.best_epoch, run.best_dev, run.best_sel_loss, run.best_step = 0, value, loss, 0

    def follow(self, params: list[torch.Tensor], heads: Sequence[int]) -> None:
        """Head heads[j]'s current weights are row j of `params` from now on: a stack that dropped its stopped
        heads from its steps (heads.training.train.StackTraining.compact). Best weights are kept from there."""
        self.source, self.rows = params, {h: j for j, h in enumerate(heads)}

    def fail(self, h: int, reason: str) -> None:
        self.runs[h].status, self.runs[h].reason = "failed", reason
        self.ok[h] = self.alive[h] = False

    def check_losses(self, losses: torch.Tensor, where: str) -> torch.Tensor:
        """Fail every still-ok head whose loss is NaN/inf ("at epoch E, step S ..." in `where`); (H,) finite."""
        finite = torch.isfinite(losses.detach()).cpu()  # (H,) on the CPU, with the tracker's flags
        for h in torch.nonzero(~finite & self.ok).flatten().tolist():
            self.fail(h, f"loss became {losses[h].item()} {where}")
        return finite

    def end_epoch(self, epoch: float, losses: torch.Tensor, scores: list[float], metric: str, step: int,
                  sel_losses: Optional[list[float]] = None, extra: Optional[dict] = None, count: bool = True,
                  trained: Optional[torch.Tensor] = None) -> None:
        """Record a dev scoring at epoch `epoch` (1-based; fractional within an epoch): mean loss (H,) since the last
        scoring and dev score per head (and out-of-domain dev loss), `extra` in each history entry; keep improved
        weights. `count`: a scoring without an improvement counts towards the patience (not during a warm-up).
        `trained` (H,) bool: the heads that trained since the last scoring (None: all); a head stopped before has
        no entry (its history ends where it stopped, as it does trained alone)."""
        for h, value in enumerate(scores):
            if trained is not None and not trained[h]:
                continue
            run = self.runs[h]
            loss = None if sel_losses is None else float(sel_losses[h])
            run.history.append({"epoch": epoch, **(extra or {}), "loss": float(losses[h]), f"dev_{metric}": value,
                                **({"ood_dev_loss": loss} if loss is not None else {})})
            if not self.alive[h]:
                continue
            if not math.isfinite(value):  # the head's outputs overflowed or became NaN
                self.fail(h, f"dev {metric} became {value} after epoch {epoch} (global step {step})")
                continue
            key = rule_key(value, loss, self.delta)
            if key > self.best[h]:
                self.best[h], self.stale[h] = key, 0
                run.best_epoch, run.best_dev, run.best_sel_loss = math.ceil(epoch), value, loss
                run.best_step = step
                for p, b in zip(self.source, self.best_state):
                    b[h] = p.detach()[self.rows[h]]
            elif count:
                self.stale[h] += 1
                if self.stale[h] >= self.patience:
                    self.alive[h], run.stopped_step = False, step

    def best_so_far(self) -> float:
        devs = [r.best_dev for r, ok in zip(self.runs, self.ok.tolist()) if ok and math.isfinite(r.best_dev)]
        return max(devs) if devs else float("nan")

    def restore_best(self) -> None:
        """Every head's parameters set to its best-scoring epoch's."""
        with torch.no_grad():
            for p, b in zip(self.params, self.best_state):
                p.copy_(b)
