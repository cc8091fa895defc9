"""Train a stack of heads together on stored features: one pass over each batch for all H heads.

Every head keeps its own seed (init, batch order, mined negatives), its own learning rate and weight
decay, its own early stopping on the dev metric and its own failure status, so a head's result does
not depend on which other heads share its stack: training H heads stacked equals training each alone.
A head whose loss turns NaN/inf is marked failed (with the step) and frozen; the others go on. Heads that stopped
or failed leave the stack's steps at the next epoch (`StackTraining.compact`): a grid whose heads stop at different
epochs computes only the ones still training (the main job's STS-B grid: 409 of 480 head-epochs).

`train_stack` runs the parts of heads.training.batches (data, batches, negatives, losses), heads.training.optim (one
optimisation step) and heads.training.tracker (dev scores, early stopping, the best weights; with `guard` the
starting point is a candidate too, so a head that never beats it on dev returns it).
"""
from __future__ import annotations

import copy
from dataclasses import replace
import math
import time
from typing import Optional

import torch

from headstore.data.memory import trim_heap
from headstore.data.progress import progress_bar, progress_write
from headstore.heads.training.anchor import AnchorPool, AnchorSampler, anchor_pool, own_texts
from headstore.heads.training.cost import DEV_SHARE, LONG_EPOCH, scoring_interval
from headstore.heads.training.linear_fit import fit_linear_stack

from headstore.heads.training.batches import (NegativeSource, batch_losses, epoch_batches, make_batch, n_batches,
                                              prepare_data)
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.evaluation.evaluate import embedder
from headstore.heads.network.features import Normalizer
from headstore.heads.kinds import Task, kind_of
from headstore.heads.network.model import StackedMLP, outputs_inputs
from headstore.heads.training.optim import StackOptimizer
from headstore.heads.training.resolved import ResolvedTraining, as_plan
from headstore.heads.training.selection import OodSelection
from headstore.heads.training.strength import choose, strength_curves, with_strength
from headstore.heads.training.tracker import HeadRun, HeadTracker, dev_scores


class TrainingDiverged(ValueError):
    """A head's loss or dev metric became NaN or infinite (bad settings, e.g. a far too high lr)."""


def train_stack(task: Task, features: torch.Tensor, head_cfg: HeadConfig,
                configs: ResolvedTraining | list[TrainConfig], progress: bool = True, select_split: str = "dev",
                selection: Optional[OodSelection] = None,
                init: Optional[tuple[StackedMLP, Normalizer]] = None,
                anchor_rows: Optional[AnchorPool] = None,
                in_place: bool = False) -> tuple[StackedMLP, Normalizer, list[HeadRun]]:
    """Train a stack of heads of one shape together; returns the best-on-dev stack (at the strength the
    settings ask for, heads.training.strength).

    features: (N, D) raw store features ((N, L * D) for a head mixing L arrays). `configs`: the heads' settings
    resolved at the door (heads.training.resolved), or one TrainConfig per head, resolved here; they must share
    `stack_key` (they differ only in lr, weight decay and seed). `selection`: out-of-domain dev sets that
    take part in choosing each head's epoch (heads.training.selection). `init`: heads (and their normaliser) to go
    on training instead of fresh ones (a shared head trained on task A, then on B:
    heads.experiments.compare.forgetting); copied. A task without `select_split` (few-shot labelled texts) trains
    every epoch and keeps the last. `anchor_rows`: the anchor's pool at positions of `features` (heads.training.anchor;
    None: the task's own texts it may train on, `own_texts`).
    `in_place`: `features` are normalised in place (batches.prepare_data) and hold the head's inputs after."""
    plan = as_plan(configs)  # checks the stack shares what it must, and the solver
    if plan.solver == "lbfgs":  # a linear classifier fitted to its optimum (heads.training.linear_fit)
        if init is not None or selection or plan.anchor_weight:
            raise ValueError("--solver lbfgs fits a head from scratch on the labelled texts: it takes no starting "
                             "head, --select-ood or --anchor-weight (use --solver adamw)")
        return fit_linear_stack(task, features, head_cfg, list(plan.settings), in_place)
    run = StackTraining(task, features, head_cfg, plan, select_split, selection, init, anchor_rows, in_place)
    return run_epochs(run, plan.epochs, f"{run.H} head(s) {plan.loss}", progress)


def run_epochs(run, epochs: int, desc: str, progress: bool):
    """`run`'s epochs (a StackTraining) while any head of the stack is alive, under one progress bar; its finish."""
    bar = progress_bar(total=run.total, desc=desc, disable=not progress, leave=False)
    if progress and run.every < run.steps_per_epoch:
        progress_write(scoring_line(run.scoring_report(), run.metric))
    t0 = time.perf_counter()
    for epoch in range(epochs):
        if not bool(run.tracker.alive.any()):
            break
        run.epoch(epoch, bar)
    bar.close()
    out = run.finish(time.perf_counter() - t0)
    if progress and run.every < run.steps_per_epoch and run.H == 1:
        progress_write(stop_line(out[2][0], run.total, run.metric))
    return out


def scoring_line(report: dict, metric: str) -> str:
    """The terminal's line on dev scored within long epochs (StackTraining.scoring_report)."""
    return (f"dev {metric} scored every {report['every_steps']} steps ({report['chosen']}; an epoch is "
            f"{report['epoch_steps']} steps); early stop after {report['patience_steps']} steps without an "
            f"improvement ({report['patience_scorings']} scorings), counted after the {report['warmup_steps']} "
            "warm-up steps")


def stop_line(run: HeadRun, total: int, metric: str) -> str:
    """The terminal's line on where a head trained with scorings within epochs stopped, and what it kept."""
    kept = "the starting point (no step beat it on dev)" if run.best_step == 0 else f"step {run.best_step}'s weights"
    if run.stopped_step is None:
        return f"trained all {total} steps; kept {kept}"
    return (f"early stop at step {run.stopped_step} of {total}: dev {metric} did not improve for "
            f"{run.scoring['patience_steps']} steps; kept {kept}")


class StackTraining:
    """The state of one stack's training: data, heads, optimiser, tracker, negatives, per-head generators."""

    compacts = True  # stopped heads leave the steps (compact); a subclass with per-head state of its own says False

    def __init__(self, task: Task, features: torch.Tensor, head_cfg: HeadConfig, plan: ResolvedTraining,
                 select_split: str, selection: Optional[OodSelection], init: Optional[tuple[StackedMLP, Normalizer]],
                 anchor_rows: Optional[AnchorPool] = None, in_place: bool = False):
        self.plan = plan
        self.task, self.select_split, self.selection = task, select_split, selection
        self.data = prepare_data(task, features, plan.loss, plan.normalize, blocks=head_cfg.mix,
                                 norm=None if init is None else init[1], in_place=in_place)
        if head_cfg.sides == "query" and self.data.pairs.form == "classes":
            raise ValueError(f"{task.name}: a query-side head (--sides query) trains on (query, document) pairs; "
                             "labelled texts have no such sides (use --sides both)")
        self.H, self.P, self.B = plan.n_heads, len(self.data), min(plan.batch_size, len(self.data))
        self.model = (StackedMLP(self.H, head_cfg, seeds=list(plan.seeds)) if init is None
                      else copy.deepcopy(init[0])).to(self.data.X.device)  # initialised on the CPU: the same
        # numbers on every device. The heads still training; the whole stack (finish) is self.stack:
        self.stack, self.live = self.model, list(range(self.H))  # self.model's row j is head live[j] (compact)
        if self.model.n_heads != self.H or self.model.cfg != head_cfg:
            raise ValueError(f"init holds {self.model.n_heads} head(s) of {self.model.cfg}; this stack needs "
                             f"{self.H} of {head_cfg}")
        self.sampler = kind_of(task).sampler(task)  # labelled texts: P classes x K texts (heads.kinds.labels)
        self.select = select_split in task.eval_sets  # no split to select on (few-shot): every epoch, keep the last
        self.select_task, self.select_report = task, {}
        if self.select:  # a large IR corpus: dev ranked on candidates each epoch (heads.kinds.ir.selection_set)
            chosen, self.select_report = kind_of(task).selection_set(task, select_split, self.data.X,
                                                                     plan.negatives)
            self.select_task = replace(task, eval_sets={**task.eval_sets, select_split: chosen})
        self.steps_per_epoch = self.epoch_steps()
        self.total = self.steps_per_epoch * plan.epochs
        self.optimizer = StackOptimizer(self.model, plan, self.total)
        self.every = self.scoring_interval()  # steps between dev scorings (an epoch, or N within a long one)
        self.tracker = HeadTracker(plan.settings, self.optimizer.params, plan.patience,
                                   selection.delta if selection else 0.0)
        self.negatives = NegativeSource(task, self.data, plan, self.H)
        trim_heap()  # the one-time candidate searches' freed blocks back to the OS before the epochs (peak RSS)
        self.gens = [torch.Generator().manual_seed(seed) for seed in plan.seeds]
        self.metric = kind_of(task).primary_metric(plan.eval_energy)
        self.step = 0
        pool = anchor_rows if anchor_rows is not None or not plan.anchor_weight else anchor_pool(task, *own_texts(task))
        self.anchor = AnchorSampler(pool, plan.anchor_weight, plan.seeds) if plan.anchor_weight else None
        if self.select:
            self.tracker.start(self.start_scores(), self.sel_losses(), plan.guard)

    def start_scores(self) -> list[float]:
        """Every head's dev score at the start. Heads that start by giving back their input (outputs_inputs: residual
        heads) all score what the features score, computed once for the stack: the same numbers bit for bit."""
        if not outputs_inputs(self.model):
            return self.dev_scores(None)
        return dev_scores(self.select_task, self.select_split, None, self.data.X, self.plan.eval_energy,
                          self.plan.precision) * self.H

    def sel_losses(self, heads: Optional[torch.Tensor] = None) -> Optional[list[float]]:
        """Every head's worst out-of-domain dev loss (None without --select-ood); `heads` as in dev_scores."""
        if not self.selection:
            return None
        return self.of_heads(heads, "ood_dev_loss",
                             lambda m: self.selection.losses(embedder(m, self.data.X), self.plan.eval_energy)[0].tolist())

    def dev_scores(self, heads: torch.Tensor) -> list[float]:
        """Every head's dev score: computed for `heads` (H,) bool, the heads this epoch trained (None: all); a head
        stopped before it (its weights no longer change) keeps the score it had, not computed again."""
        return self.of_heads(heads, f"dev_{self.metric}", self.stack_dev_scores)

    def stack_dev_scores(self, stack: StackedMLP) -> list[float]:
        """Every head of `stack`'s dev score (heads.training.tracker.dev_scores), in the plan's energy and precision."""
        return dev_scores(self.select_task, self.select_split, stack, self.data.X, self.plan.eval_energy,
                          self.plan.precision)

    def of_heads(self, heads: Optional[torch.Tensor], key: str, compute) -> list[float]:
        """compute(stack) -> one value per head of the stack, asked of the heads in `heads` only (None: all); the
        others' values are their last epoch's `key` in their history."""
        idx = list(range(self.H)) if heads is None else torch.nonzero(heads).flatten().tolist()
        out = [self.tracker.runs[h].history[-1][key] if h not in idx else None for h in range(self.H)]
        if idx:
            rows = [self.live.index(h) for h in idx]  # their rows in the heads training (all trained: live)
            fresh = compute(self.model if len(rows) == len(self.live) else self.model.select_heads(rows))
            for h, value in zip(idx, fresh):
                out[h] = value
        return out

    def scoring_interval(self) -> int:
        """Steps between two dev scorings (heads.training.cost.scoring_interval: --eval-every, or auto); an epoch
        where nothing is selected on (few-shot heads)."""
        if not self.select:
            return self.steps_per_epoch
        rows = kind_of(self.task).selection_rows(self.select_task, self.select_split, self.plan.negatives)
        params = sum(p.numel() for p in self.model.parameters())
        return scoring_interval(self.steps_per_epoch, params, rows, self.plan.eval_every)

    def epoch(self, epoch: int, bar) -> None:
        """One epoch of every head still training, scored on dev every `self.every` steps and at its end, with the
        tracker's bookkeeping. Heads that stopped (or failed) are dropped from the steps at the epoch's start
        (compact); one that stops within an epoch stays in its steps until its end (its rate is 0), neither
        re-mined nor scored again. The epoch ends early when every head stopped."""
        self.compact()
        data, H, live = self.data, self.H, torch.as_tensor(self.live)
        negs = self.epoch_negatives(epoch, self.tracker.alive[live])  # (h, P, K) or None, h = len(live)
        self.interval = (self.tracker.alive.clone(), torch.zeros(H, dtype=torch.float64), 0)  # (heads, loss, steps)
        self.model.train()
        for s, idx in enumerate(self.epoch_batches()):  # idx (h, b) drawn on the CPU (each head's generator),
            idx = idx.to(data.X.device)  # used where X is
            losses = self.step_losses(idx, negs)  # (h,)
            where = f"at epoch {epoch + 1}, step {s + 1} (global step {self.step + 1})"
            every = torch.zeros(H, dtype=losses.dtype).index_copy_(0, live, losses.detach().cpu())  # (H,)
            finite = self.tracker.check_losses(every, where)
            self.optimizer.step(losses, finite[live], self.tracker.ok[live], self.tracker.alive[live])
            trained, loss_sum, n = self.interval
            self.interval = (trained, loss_sum + torch.where(finite, every, torch.zeros(H)).double(), n + 1)
            self.step += 1
            bar.update(1)
            if s + 1 < self.steps_per_epoch and (s + 1) % self.every == 0:  # a scoring within the epoch
                self.score(round(epoch + (s + 1) / self.steps_per_epoch, 4), bar)
                if not bool(self.tracker.alive.any()):
                    return
        self.score(epoch + 1, bar)

    def score(self, at, bar) -> None:
        """Dev scores of the heads trained since the last scoring (`at`: the epoch, fractional within one), the
        tracker's bookkeeping (staleness counts after the warm-up only when scored within epochs), the next
        interval begun."""
        trained, loss_sum, n = self.interval
        scores = self.dev_scores(trained) if self.select else [float(at)] * self.H
        within = self.every < self.steps_per_epoch
        self.tracker.end_epoch(at, loss_sum / max(n, 1), scores, self.metric, self.step, self.sel_losses(trained),
                               extra={"step": self.step} if within else {},
                               count=not within or self.step > self.optimizer.warmup, trained=trained)
        self.interval = (self.tracker.alive.clone(), torch.zeros(self.H, dtype=torch.float64), 0)
        bar.set_postfix({f"best {self.metric}": f"{self.tracker.best_so_far():.4f}"})

    def scoring_report(self) -> dict:
        """How dev was scored and early stopping counted (metrics.json "dev_scoring")."""
        chosen = (f"--eval-every {self.plan.eval_every}" if self.plan.eval_every else
                  "auto: once an epoch" if self.every == self.steps_per_epoch else
                  f"auto: an epoch over {LONG_EPOCH} steps is scored within, ~{DEV_SHARE:.0%} of the time")
        within = self.every < self.steps_per_epoch
        return {"every_steps": self.every, "epoch_steps": self.steps_per_epoch, "chosen": chosen,
                "planned_steps": self.total, "steps_run": self.step, "patience_scorings": self.plan.patience,
                "patience_steps": self.plan.patience * self.every,
                "warmup_steps": self.optimizer.warmup if within else 0}

    def compact(self) -> None:
        """Drop the heads that stopped or failed from the steps: the model, the optimiser's state, the generators,
        negatives and anchor sampler keep the rows of the heads still training, so a stack whose heads stop at
        different epochs no longer computes the stopped ones (their weights no longer change; the tracker keeps
        every head's record and best weights). Each head's numbers are its own whatever shares its stack."""
        keep = [j for j, h in enumerate(self.live) if self.tracker.alive[h]]
        if not self.compacts or not keep or len(keep) == len(self.live):
            return
        self.live = [self.live[j] for j in keep]
        self.model = self.model.select_heads(keep)
        self.optimizer.keep_heads(keep, self.model)
        self.tracker.follow(self.optimizer.params, self.live)
        self.gens = [self.gens[j] for j in keep]
        self.negatives.keep_heads(keep)
        if self.anchor is not None:
            self.anchor.keep_heads(keep)

    # --- what an epoch's steps are made of (a distillation, heads.training.distill, gives its own) ---------
    def epoch_steps(self) -> int:
        """Steps of one epoch: the training pairs in batches (epoch_batches: no batch of one); labelled texts: the
        sampler's ceil(texts / batch) batches of whole classes."""
        return math.ceil(self.P / self.B) if self.sampler is not None else n_batches(self.P, self.B)

    def epoch_negatives(self, epoch: int, trained: torch.Tensor) -> Optional[torch.Tensor]:
        """(H, P, K) the pairs' negatives of this epoch, or None (NegativeSource)."""
        return self.negatives.for_epoch(epoch, self.model, trained)

    def epoch_batches(self):
        """This epoch's (H, b) index blocks of the training pairs, each head's from its own generator."""
        if self.sampler is not None:
            settings = [self.plan.settings[h] for h in self.live]
            return self.sampler(settings, self.gens, self.B, self.steps_per_epoch).unbind(1)
        return epoch_batches(self.gens, self.P, self.B)

    def step_losses(self, idx: torch.Tensor, negs: Optional[torch.Tensor]) -> torch.Tensor:
        """(H,) every head's loss on the pairs idx (H, b) with their negatives."""
        plan, data = self.plan, self.data
        return batch_losses(self.model, data.X, make_batch(data, idx, negs), plan, self.optimizer.init,
                            plan.q_at(self.step, self.total), data.pairs.form,
                            self.anchor.sample() if self.anchor is not None else None,
                            getattr(data.pairs, "groups", ()))

    def finish(self, elapsed: float) -> tuple[StackedMLP, Normalizer, list[HeadRun]]:
        """The best weights of every head, and its run record."""
        self.model = self.stack  # every head, at its best weights
        self.tracker.restore_best()
        if not self.select:  # the "score" was the epoch number: no dev metric exists
            for r in self.tracker.runs:
                r.best_dev = float("nan")
                for h in r.history:
                    h.pop(f"dev_{self.metric}", None)
        for r in self.tracker.runs:
            r.seconds = elapsed / self.H
            r.scoring = self.scoring_report()
            r.negatives = self.negatives.report if self.negatives.mining else {}
            r.anchor = self.anchor.report if self.anchor is not None else {}
            r.dev_candidates = self.select_report
            r.select_set = self.select_task.eval_sets.get(self.select_split) if self.select else None
        if self.plan.adjusts_strength:
            self.apply_strength()
        return self.model, self.data.norm, self.tracker.runs

    def apply_strength(self) -> None:
        """Every head at its strength (heads.training.strength): the fixed a, or with "auto" the a the selection rule
        picks on the dev curve. Without a dev split (few-shot heads) "auto" keeps a = 1."""
        fixed = self.plan.strength
        curves = strength_curves(self.model, self.strength_scores) if self.select else [[]] * self.H
        if fixed is not None:
            alphas = [fixed] * self.H
        else:
            alphas = choose(curves, self.selection.delta if self.selection else 0.0) if self.select else [1.0] * self.H
        self.model = with_strength(self.model, alphas)
        for r, a, curve in zip(self.tracker.runs, alphas, curves):
            r.strength, r.strength_curve = a, curve

    def strength_scores(self, stack: StackedMLP):
        """(in-domain dev per head, worst OOD dev loss per head or None, {OOD set: metric per head})."""
        dev = self.stack_dev_scores(stack)
        if not self.selection:
            return dev, None, {}
        loss, per_set = self.selection.losses(embedder(stack, self.data.X), self.plan.eval_energy)
        return dev, loss.tolist(), per_set


def train_one(task: Task, features: torch.Tensor, head_cfg: HeadConfig, cfg: ResolvedTraining | TrainConfig,
              progress: bool = True, selection: Optional[OodSelection] = None,
              anchor_rows: Optional[AnchorPool] = None,
              in_place: bool = False) -> tuple[StackedMLP, Normalizer, HeadRun]:
    """Train a single head (`cfg`: its settings resolved at the door, or a TrainConfig resolved here); a NaN/inf
    loss raises TrainingDiverged naming the step (in_place: train_stack)."""
    plan = cfg if isinstance(cfg, ResolvedTraining) else [cfg]
    model, norm, (run,) = train_stack(task, features, head_cfg, plan, progress, selection=selection,
                                      anchor_rows=anchor_rows, in_place=in_place)
    if run.status == "failed":
        raise TrainingDiverged(f"{task.name}: training stopped: {run.reason}; lower --lr or change the loss "
                               f"settings (q, margin, tau)")
    return model, norm, run
