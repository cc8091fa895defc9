"""Train a stack of heads together on stored features: one pass over each batch for all H heads.

Every head keeps its own seed (init, batch order, mined negatives), its own learning rate and weight
decay, its own early stopping on the dev metric and its own failure status, so a head's result does
not depend on which other heads share its stack: training H heads stacked equals training each alone.
A head whose loss turns NaN/inf is marked failed (with the step) and frozen; the others go on.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from headstore.heads.config import TrainConfig, stack_key
from headstore.heads.evaluate import embed_rows, evaluate_split, primary_metric
from headstore.heads.features import Normalizer
from headstore.heads.label_tasks import loss_mismatch
from headstore.heads.losses import LOSS_KINDS, get_loss
from headstore.heads.mining import mine_negatives
from headstore.heads.model import HeadConfig, StackedMLP
from headstore.heads.stacked_adamw import StackedAdamW
from headstore.heads.tasks import Task


# graded / labelled pairs given to a loss that takes positive pairs only (mnr, l1-ce, triplet): keep the
# pairs whose label is at least this (STS score >= 4 of 5, "mostly equivalent"; 1 for 0/1 labels)
GENUINE_THRESHOLD = 0.8


class TrainingDiverged(RuntimeError):
    """A head's loss became NaN or infinite."""


@dataclass
class HeadRun:
    """What training one head produced."""

    config: TrainConfig
    status: str = "ok"  # ok | failed
    reason: str = ""
    best_epoch: int = -1
    best_dev: float = float("nan")
    history: list[dict] = field(default_factory=list)  # per epoch: loss, dev metric
    seconds: float = 0.0


def lr_factor(step: int, total: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine / linear decay to 0 (or constant)."""
    warm = int(round(cfg.warmup_ratio * total))
    if step < warm:
        return (step + 1) / warm
    if cfg.schedule == "constant":
        return 1.0
    progress = (step - warm) / max(1, total - warm)
    return 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else max(0.0, 1 - progress)


def _clip_per_head(params: list[torch.Tensor], max_norm: float) -> None:
    norms = torch.zeros(params[0].shape[0])
    for p in params:
        norms += p.grad.pow(2).flatten(1).sum(1)
    scale = (max_norm / (norms.sqrt() + 1e-6)).clamp(max=1.0)  # (H,)
    for p in params:
        p.grad.mul_(scale.view(-1, *([1] * (p.dim() - 1))))


def same_mask(a: torch.Tensor, p: torch.Tensor, relevant: torch.Tensor, n_rows: int) -> torch.Tensor:
    """(H, B, B): True where in-batch pair (a_i, p_j) must not be an impostor.

    Duplicate anchors or positives within a batch, and known relevant pairs, are never pushed apart."""
    code = a.unsqueeze(-1) * n_rows + p.unsqueeze(-2)  # (H, B, B)
    known = torch.isin(code, relevant) if relevant.numel() else torch.zeros_like(code, dtype=torch.bool)
    return (a.unsqueeze(-1) == a.unsqueeze(-2)) | (p.unsqueeze(-1) == p.unsqueeze(-2)) | known


def training_pairs(task: Task, loss: str):
    """(pairs, labels (P,) float32 tensor or None) the loss trains on.

    A loss that needs labels refuses positives-only data; a positives-only loss on labelled data keeps
    the genuine pairs (label >= GENUINE_THRESHOLD) and drops the labels."""
    kind = LOSS_KINDS[loss]
    train = task.train
    mismatch = loss_mismatch(task, loss)
    if mismatch:
        raise ValueError(mismatch)
    if kind.labels == "required" and train.labels is None:
        raise ValueError(f"loss {loss!r} needs labelled or graded pairs; {task.name} has positives only")
    if train.labels is not None and kind.labels != "none":
        return train, torch.as_tensor(train.labels, dtype=torch.float32)
    if train.labels is not None:
        keep = train.labels >= GENUINE_THRESHOLD
        train = type(train)(train.anchor[keep], train.positive[keep], None,
                            None if train.negative is None else train.negative[keep])
    return train, None


def train_stack(task: Task, features: torch.Tensor, head_cfg: HeadConfig, configs: list[TrainConfig],
                progress: bool = True, select_split: str = "dev",
                init: tuple[StackedMLP, Normalizer] | None = None) -> tuple[StackedMLP, Normalizer, list[HeadRun]]:
    """Train len(configs) heads of one shape together; returns the best-on-dev stack.

    features: (N, D) raw store features. All configs must share `stack_key` (they differ only in
    lr, weight decay and seed). `init`: heads (and their normaliser) to go on training instead of
    fresh ones (a shared head trained on task A, then on B: heads.experiments.forgetting); copied."""
    assert len({stack_key(c) for c in configs}) == 1, "a stack mixes settings that must be shared"
    cfg0 = configs[0]
    if task.train is None or len(task.train) == 0:
        raise ValueError(f"{task.name}: no training pairs (no train split)")
    kind = LOSS_KINDS[cfg0.loss]
    train, labels_all = training_pairs(task, cfg0.loss)
    H, P, B = len(configs), len(train), min(cfg0.batch_size, len(train))
    fit_rows = np.unique(np.concatenate([train.anchor, train.positive]))
    norm = Normalizer.fit(cfg0.normalize, features[torch.as_tensor(fit_rows)]) if init is None else init[1]
    X = norm(features)  # (N, D)
    model = StackedMLP(H, head_cfg, seeds=[c.seed for c in configs]) if init is None else copy.deepcopy(init[0])
    if model.n_heads != H or model.cfg != head_cfg:
        raise ValueError(f"init holds {model.n_heads} head(s) of {model.cfg}; this stack needs {H} of {head_cfg}")
    params = list(model.parameters())
    init = [p.detach().clone() for p in params]
    opt = StackedAdamW(params, lr=[c.lr for c in configs], weight_decay=[c.weight_decay for c in configs]) if params else None
    base_lr = torch.tensor([c.lr for c in configs], dtype=torch.float64)
    alive = torch.ones(H, dtype=torch.bool)  # still training (not stopped early, not failed)
    ok = torch.ones(H, dtype=torch.bool)
    runs = [HeadRun(c) for c in configs]
    best_state = [p.detach().clone() for p in params]
    best = torch.full((H,), -float("inf"))
    stale = torch.zeros(H, dtype=torch.long)
    loss_fn, loss_cfg = get_loss(cfg0.loss), cfg0.loss_config()
    anchor = torch.as_tensor(train.anchor)
    positive = torch.as_tensor(train.positive)
    relevant = torch.as_tensor(sorted(a * (len(X) + 1) + p for a, p in task.relevant), dtype=torch.long)
    gens = [torch.Generator().manual_seed(c.seed) for c in configs]
    steps_per_epoch = math.ceil(P / B)
    total = steps_per_epoch * cfg0.epochs
    sampler = getattr(task, "sample_batches", None)  # labelled texts: P classes x K texts (heads.label_tasks)
    select = select_split in task.eval_sets  # no split to select on (few-shot): every epoch, keep the last
    given = None if train.negative is None or not kind.negatives else torch.as_tensor(train.negative)
    energy = cfg0.eval_energy
    metric = primary_metric(task.kind, energy)
    bar = tqdm(total=total, desc=f"{H} head(s) {cfg0.loss}", disable=not progress, leave=False)
    step = 0
    t0 = time.perf_counter()
    for epoch in range(cfg0.epochs):
        if not bool(alive.any()):
            break
        negs = given.unsqueeze(0).expand(H, -1, -1) if given is not None else None  # (H, P, K)
        if cfg0.mined_k and kind.negatives and task.corpus_rows is not None:
            embed = (lambda rows: embed_rows(model, X, rows)) if cfg0.remine and epoch > 0 else None
            mined = mine_negatives(X, train.anchor, task.corpus_rows, task.relevant, cfg0.mined_k, embed, H,
                                   energy=energy)
            negs = mined if negs is None else torch.cat([negs, mined], dim=-1)
        if sampler is not None:
            batches = sampler(configs, gens, B, steps_per_epoch)  # (H, steps, b)
        else:
            perms = torch.stack([torch.randperm(P, generator=g) for g in gens])  # (H, P)
        epoch_loss = torch.zeros(H, dtype=torch.float64)
        model.train()
        for s in range(steps_per_epoch):
            idx = batches[:, s] if sampler is not None else perms[:, s * B:(s + 1) * B]  # (H, b)
            a_rows, p_rows = anchor[idx], positive[idx]
            za, zp = model(X[a_rows]), model(X[p_rows])  # (H, b, d)
            zn = None
            if negs is not None:
                n_rows = torch.gather(negs, 1, idx.unsqueeze(-1).expand(-1, -1, negs.shape[-1]))  # (H, b, K)
                zn = model(X[n_rows.flatten(1)]).unflatten(1, n_rows.shape[1:])  # (H, b, K, d)
            labels = labels_all[idx] if labels_all is not None else None  # (H, b)
            same = same_mask(a_rows, p_rows, relevant, len(X) + 1)
            losses = loss_fn(za, zp, zn, labels, energy=cfg0.energy, cfg=loss_cfg, same=same)  # (H,)
            if cfg0.decay_to_init:
                losses = losses + cfg0.decay_to_init * sum((p - p0).pow(2).flatten(1).sum(1) for p, p0 in zip(params, init))
            finite = torch.isfinite(losses.detach())
            for h in torch.nonzero(~finite & ok).flatten().tolist():
                runs[h].status, ok[h], alive[h] = "failed", False, False
                runs[h].reason = (f"loss became {losses[h].item()} at epoch {epoch + 1}, step {s + 1} "
                                  f"(global step {step + 1})")
            if opt is not None:
                opt.zero_grad(set_to_none=False)
                torch.where(finite, losses, torch.zeros_like(losses)).sum().backward()
                for p in params:
                    p.grad[~ok] = 0.0
                    p.grad.nan_to_num_(0.0, 0.0, 0.0)
                if cfg0.grad_clip:
                    _clip_per_head(params, cfg0.grad_clip)
                opt.param_groups[0]["head_lr"] = base_lr * lr_factor(step, total, cfg0) * alive.double()
                opt.step()
            epoch_loss += torch.where(finite, losses.detach(), torch.zeros_like(losses)).double()
            step += 1
            bar.update(1)
        if select:
            dev, _ = evaluate_split(task, select_split, lambda rows: embed_rows(model, X, rows), (energy,))
        for h in range(H):
            value = dev[h][metric] if select else float(epoch + 1)  # no dev: the latest epoch is the best
            runs[h].history.append({"epoch": epoch + 1, "loss": float(epoch_loss[h] / steps_per_epoch)}
                                   | ({f"dev_{metric}": value} if select else {}))
            if not alive[h]:
                continue
            if value > best[h]:
                best[h], stale[h] = value, 0
                runs[h].best_epoch, runs[h].best_dev = epoch + 1, value if select else float("nan")
                for p, b in zip(params, best_state):
                    b[h] = p.detach()[h]
            else:
                stale[h] += 1
                if stale[h] >= cfg0.patience:
                    alive[h] = False
        bar.set_postfix({f"best {metric}": f"{float(best[ok].max()) if ok.any() else float('nan'):.4f}"})
    bar.close()
    with torch.no_grad():
        for p, b in zip(params, best_state):
            p.copy_(b)
    elapsed = time.perf_counter() - t0
    for r in runs:
        r.seconds = elapsed / H
    return model, norm, runs


def train_one(task: Task, features: torch.Tensor, head_cfg: HeadConfig, cfg: TrainConfig,
              progress: bool = True) -> tuple[StackedMLP, Normalizer, HeadRun]:
    """Train a single head; a NaN/inf loss raises TrainingDiverged naming the step."""
    model, norm, (run,) = train_stack(task, features, head_cfg, [cfg], progress)
    if run.status == "failed":
        raise TrainingDiverged(f"{task.name}: training stopped: {run.reason}; lower --lr or change the loss "
                               f"settings (q, margin, tau)")
    return model, norm, run
