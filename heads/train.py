"""Train a stack of heads together on stored features: one pass over each batch for all H heads.

Every head keeps its own seed (init, batch order, mined negatives), its own learning rate and weight
decay, its own early stopping on the dev metric and its own failure status, so a head's result does
not depend on which other heads share its stack: training H heads stacked equals training each alone.
A head whose loss turns NaN/inf is marked failed (with the step) and frozen; the others go on.

`train_stack` runs the parts of heads.batches (data, batches, negatives, losses), heads.optim (one
optimisation step) and heads.tracker (dev scores, early stopping, the best weights; with `guard` the
starting point is a candidate too, so a head that never beats it on dev returns it).
"""
from __future__ import annotations

import copy
import math
import time
from typing import Optional

import torch
from tqdm.auto import tqdm

from headstore.heads.batches import NegativeSource, batch_losses, epoch_batches, make_batch, prepare_data, q_at
from headstore.heads.config import HeadConfig, TrainConfig, stack_key
from headstore.heads.evaluate import embed_rows
from headstore.heads.features import Normalizer
from headstore.heads.kinds import Task, kind_of
from headstore.heads.model import StackedMLP
from headstore.heads.optim import StackOptimizer
from headstore.heads.selection import OodSelection
from headstore.heads.tracker import HeadRun, HeadTracker, dev_scores


class TrainingDiverged(ValueError):
    """A head's loss or dev metric became NaN or infinite (bad settings, e.g. a far too high lr)."""


def train_stack(task: Task, features: torch.Tensor, head_cfg: HeadConfig, configs: list[TrainConfig],
                progress: bool = True, select_split: str = "dev",
                selection: Optional[OodSelection] = None,
                init: Optional[tuple[StackedMLP, Normalizer]] = None) -> tuple[StackedMLP, Normalizer, list[HeadRun]]:
    """Train len(configs) heads of one shape together; returns the best-on-dev stack.

    features: (N, D) raw store features ((N, L * D) for a head mixing L arrays). All configs must share
    `stack_key` (they differ only in lr, weight decay and seed). `selection`: out-of-domain dev sets that
    take part in choosing each head's epoch (heads.selection). `init`: heads (and their normaliser) to go
    on training instead of fresh ones (a shared head trained on task A, then on B:
    heads.experiments.forgetting); copied. A task without `select_split` (few-shot labelled texts) trains
    every epoch and keeps the last."""
    assert len({stack_key(c) for c in configs}) == 1, "a stack mixes settings that must be shared"
    cfg0 = configs[0]
    data = prepare_data(task, features, cfg0, blocks=head_cfg.mix, norm=None if init is None else init[1])
    H, P, B = len(configs), len(data), min(cfg0.batch_size, len(data))
    model = StackedMLP(H, head_cfg, seeds=[c.seed for c in configs]) if init is None else copy.deepcopy(init[0])
    if model.n_heads != H or model.cfg != head_cfg:
        raise ValueError(f"init holds {model.n_heads} head(s) of {model.cfg}; this stack needs {H} of {head_cfg}")
    sampler = kind_of(task).sampler(task)  # labelled texts: P classes x K texts (heads.kinds.labels)
    select = select_split in task.eval_sets  # no split to select on (few-shot): every epoch, keep the last
    steps_per_epoch = math.ceil(P / B)
    total = steps_per_epoch * cfg0.epochs
    optimizer = StackOptimizer(model, configs, total)
    tracker = HeadTracker(configs, optimizer.params, cfg0.patience, selection.delta if selection else 0.0)
    negatives = NegativeSource(task, data, cfg0, H)
    gens = [torch.Generator().manual_seed(c.seed) for c in configs]
    metric = kind_of(task).primary_metric(cfg0.eval_energy)

    def sel_losses() -> Optional[list[float]]:
        if not selection:
            return None
        return selection.losses(lambda rows: embed_rows(model, data.X, rows), cfg0.eval_energy)[0].tolist()

    if select:
        tracker.start(dev_scores(task, select_split, model, data.X, cfg0), sel_losses(), cfg0.guard)
    bar = tqdm(total=total, desc=f"{H} head(s) {cfg0.loss}", disable=not progress, leave=False)
    step = 0
    t0 = time.perf_counter()
    for epoch in range(cfg0.epochs):
        if not bool(tracker.alive.any()):
            break
        negs = negatives.for_epoch(epoch, model)  # (H, P, K) or None
        epoch_loss = torch.zeros(H, dtype=torch.float64)
        model.train()
        batches = (sampler(configs, gens, B, steps_per_epoch).unbind(1) if sampler is not None  # (H, b) each
                   else epoch_batches(gens, P, B))
        for s, idx in enumerate(batches):
            losses = batch_losses(model, data.X, make_batch(data, idx, negs), cfg0, optimizer.init,
                                  q_at(cfg0, step, total), data.pairs.form)
            finite = tracker.check_losses(losses, f"at epoch {epoch + 1}, step {s + 1} (global step {step + 1})")
            optimizer.step(losses, finite, tracker.ok, tracker.alive)
            epoch_loss += torch.where(finite, losses.detach(), torch.zeros_like(losses)).double()
            step += 1
            bar.update(1)
        scores = dev_scores(task, select_split, model, data.X, cfg0) if select else [float(epoch + 1)] * H
        tracker.end_epoch(epoch + 1, epoch_loss / steps_per_epoch, scores, metric, step, sel_losses())
        bar.set_postfix({f"best {metric}": f"{tracker.best_so_far():.4f}"})
    bar.close()
    tracker.restore_best()
    if not select:  # the "score" was the epoch number: no dev metric exists
        for r in tracker.runs:
            r.best_dev = float("nan")
            for h in r.history:
                h.pop(f"dev_{metric}", None)
    elapsed = time.perf_counter() - t0
    for r in tracker.runs:
        r.seconds = elapsed / H
    return model, data.norm, tracker.runs


def train_one(task: Task, features: torch.Tensor, head_cfg: HeadConfig, cfg: TrainConfig,
              progress: bool = True, selection: Optional[OodSelection] = None) -> tuple[StackedMLP, Normalizer, HeadRun]:
    """Train a single head; a NaN/inf loss raises TrainingDiverged naming the step."""
    model, norm, (run,) = train_stack(task, features, head_cfg, [cfg], progress, selection=selection)
    if run.status == "failed":
        raise TrainingDiverged(f"{task.name}: training stopped: {run.reason}; lower --lr or change the loss "
                               f"settings (q, margin, tau)")
    return model, norm, run
