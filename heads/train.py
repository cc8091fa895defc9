"""Train a stack of heads together on stored features: one pass over each batch for all H heads.

Every head keeps its own seed (init, batch order, mined negatives), its own learning rate and weight
decay, its own early stopping on the dev metric and its own failure status, so a head's result does
not depend on which other heads share its stack: training H heads stacked equals training each alone.
A head whose loss turns NaN/inf is marked failed (with the step) and frozen; the others go on.

`train_stack` runs the parts below, one job each:
- `prepare_data`: the normalised features and the training pairs as tensors (`TrainingData`);
- `epoch_batches`: each head's batches of one epoch, from its own generator;
- `NegativeSource`: given and mined negatives of every pair (mined once, or each epoch with --remine);
- `make_batch` + `batch_losses`: the rows of one step and every head's loss on them;
- `StackOptimizer`: one optimisation step (backward, per-head clipping, StackedAdamW, lr schedule);
- `dev_scores`: the per-epoch selection metric of every head (and, with `--select-ood`, the out-of-domain
  dev loss of heads.selection);
- `HeadTracker`: failures, early stopping and the best weights of every head under the selection rule;
  with `guard` (the default) the starting point (the identity head, for the default residual head) is a
  candidate too, so a head that never beats it on dev returns it.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from headstore.heads.config import TrainConfig, stack_key
from headstore.heads.evaluate import embed_rows, primary_metric, selection_scores
from headstore.heads.features import Normalizer
from headstore.heads.label_tasks import loss_mismatch
from headstore.heads.losses import LOSS_KINDS, get_loss
from headstore.heads.mining import mine_negatives
from headstore.heads.model import HeadConfig, StackedMLP, autocast
from headstore.heads.schedule import lr_lambda
from headstore.heads.selection import OodSelection, rule_key
from headstore.heads.stacked_adamw import StackedAdamW, fused_pays
from headstore.heads.tasks import Task


# graded / labelled pairs given to a loss that takes positive pairs only (mnr, l1-ce, triplet): keep the
# pairs whose label is at least this (STS score >= 4 of 5, "mostly equivalent"; 1 for 0/1 labels)
GENUINE_THRESHOLD = 0.8


class TrainingDiverged(ValueError):
    """A head's loss or dev metric became NaN or infinite (bad settings, e.g. a far too high lr)."""


@dataclass
class HeadRun:
    """What training one head produced."""

    config: TrainConfig
    status: str = "ok"  # ok | failed
    reason: str = ""
    best_epoch: int = -1  # 0: the starting point (guard) was kept
    best_dev: float = float("nan")
    history: list[dict] = field(default_factory=list)  # per epoch: loss, dev metric
    seconds: float = 0.0
    start_dev: float = float("nan")  # the dev metric of the starting point (before any update)
    best_sel_loss: Optional[float] = None  # out-of-domain dev loss of the kept weights (--select-ood)


def warmup_steps(cfg: TrainConfig, total: int) -> int:
    """Warm-up updates of a run of `total` updates: warmup_ratio of them, rounded."""
    return int(round(cfg.warmup_ratio * total))


def lr_factor(step: int, total: int, cfg: TrainConfig) -> float:
    """Factor of the peak lr at update `step` of `total` under cfg's schedule (heads.schedule: transformers'
    warm-up schedules, the warm-up counting the update being taken)."""
    return lr_lambda(cfg.schedule, warmup_steps(cfg, total), total)(step)


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
        if not keep.any():
            raise ValueError(f"{task.name}: loss {loss!r} trains on positive pairs, and no train pair has a label "
                             f">= {GENUINE_THRESHOLD} (of 1; STS: score at the top fifth of its range) (check "
                             "--score-range, or use a loss that takes graded labels: l1-energy, contrastive, cosent)")
        train = type(train)(train.anchor[keep], train.positive[keep], None,
                            None if train.negative is None else train.negative[keep])
    return train, None


# ---------------------------------------------------------------------------- data and batches


@dataclass(frozen=True)
class TrainingData:
    """What a stack trains on: the features the heads read and the training pairs, as tensors.

    Rows are store rows; `X[rows]` is what a head's forward pass takes (a head with another input,
    e.g. several layers per text, only needs X to hold that input per row)."""

    X: torch.Tensor  # (N, D) features after the normaliser
    norm: Normalizer  # fitted on the training texts only
    pairs: object  # the PairSet trained on (heads.tasks), after `training_pairs`
    anchor: torch.Tensor  # (P,) int64 store rows
    positive: torch.Tensor  # (P,) int64
    labels: Optional[torch.Tensor]  # (P,) float32 pair labels / STS scores, or None (positives only)
    given: Optional[torch.Tensor]  # (P, K) int64 given negatives the loss uses, or None
    relevant: torch.Tensor  # sorted codes anchor * code_base + positive of known relevant pairs
    code_base: int  # len(X) + 1

    def __len__(self) -> int:
        return len(self.anchor)


def prepare_data(task: Task, features: torch.Tensor, cfg: TrainConfig, blocks: int = 1,
                 norm: Optional[Normalizer] = None) -> TrainingData:
    """Training pairs of cfg's loss, the normaliser fitted on their texts, the normalised features.
    blocks: stored arrays side by side in `features` (a mixing head), each L2-normalised on its own.
    norm: a normaliser to keep instead (heads that go on training keep the one they were trained with)."""
    if task.train is None or len(task.train) == 0:
        raise ValueError(f"{task.name}: no training pairs (no train split)")
    pairs, labels = training_pairs(task, cfg.loss)
    fit_rows = np.unique(np.concatenate([pairs.anchor, pairs.positive]))
    if norm is None:
        norm = Normalizer.fit(cfg.normalize, features[torch.as_tensor(fit_rows)], blocks=blocks)
    X = norm(features)  # (N, D)
    base = len(X) + 1
    relevant = torch.as_tensor(sorted(a * base + p for a, p in task.relevant), dtype=torch.long)
    use_given = pairs.negative is not None and LOSS_KINDS[cfg.loss].negatives
    return TrainingData(X, norm, pairs, torch.as_tensor(pairs.anchor), torch.as_tensor(pairs.positive), labels,
                        torch.as_tensor(pairs.negative) if use_given else None, relevant, base)


def epoch_batches(gens: list[torch.Generator], n_pairs: int, batch_size: int) -> list[torch.Tensor]:
    """One epoch's batches: a permutation of the pairs per head from its own generator, cut into
    (H, b) index blocks (the last block holds the remainder)."""
    perms = torch.stack([torch.randperm(n_pairs, generator=g) for g in gens])  # (H, P)
    return list(perms.split(batch_size, dim=1))


class NegativeSource:
    """Negatives of every training pair for an epoch: given ones, then mined ones, (H, P, K) store rows.

    Mined once in feature space (cosine over the stored features, shared by all heads), or with
    cfg.remine re-mined each epoch after the first in each head's own space with its own energy."""

    def __init__(self, task: Task, data: TrainingData, cfg: TrainConfig, n_heads: int):
        self.task, self.data, self.cfg, self.n_heads = task, data, cfg, n_heads
        self.mining = bool(cfg.mined_k and LOSS_KINDS[cfg.loss].negatives and task.corpus_rows is not None)
        self.mined: Optional[torch.Tensor] = None  # (H, P, k)

    def for_epoch(self, epoch: int, model: StackedMLP) -> Optional[torch.Tensor]:
        """(H, P, K) negatives for epoch `epoch` (0-based), or None when the loss uses none."""
        cfg, data = self.cfg, self.data
        given = data.given.unsqueeze(0).expand(self.n_heads, -1, -1) if data.given is not None else None
        if self.mining and (self.mined is None or cfg.remine):
            embed = (lambda rows: embed_rows(model, data.X, rows)) if cfg.remine and epoch > 0 else None
            self.mined = mine_negatives(data.X, data.pairs.anchor, self.task.corpus_rows, self.task.relevant,
                                        cfg.mined_k, embed, self.n_heads, energy=cfg.eval_energy)
        if self.mined is None:
            return given
        return self.mined if given is None else torch.cat([given, self.mined], dim=-1)


@dataclass(frozen=True)
class Batch:
    """The store rows of one step for every head."""

    anchor: torch.Tensor  # (H, b)
    positive: torch.Tensor  # (H, b)
    negative: Optional[torch.Tensor]  # (H, b, K) or None
    labels: Optional[torch.Tensor]  # (H, b) or None
    same: Optional[torch.Tensor]  # (H, b, b) in-batch pairs that are no impostors (same_mask); None for
    # labelled or graded pairs, whose impostors are the pairs labelled so (no loss takes in-batch impostors)


def make_batch(data: TrainingData, idx: torch.Tensor, negatives: Optional[torch.Tensor]) -> Batch:
    """Batch of pair indices idx (H, b), with each pair's negatives from `negatives` (H, P, K)."""
    a_rows, p_rows = data.anchor[idx], data.positive[idx]
    n_rows = None
    if negatives is not None:
        n_rows = torch.gather(negatives, 1, idx.unsqueeze(-1).expand(-1, -1, negatives.shape[-1]))  # (H, b, K)
    if data.labels is not None and data.labels.dim() == 1:
        return Batch(a_rows, p_rows, n_rows, data.labels[idx], None)
    labels = data.labels[idx] if data.labels is not None else None  # class-label codes (H, b, L): the
    # loss compares every pair of the batch, so the same text twice must not count (same_mask)
    return Batch(a_rows, p_rows, n_rows, labels, same_mask(a_rows, p_rows, data.relevant, data.code_base))
    return Batch(a_rows, p_rows, n_rows, None, same_mask(a_rows, p_rows, data.relevant, data.code_base))


def q_at(cfg: TrainConfig, step: int, total: int) -> Optional[float]:
    """l1-energy's Q at update `step` of `total` under cfg's Q schedule: from q_start linearly to q (its
    default when unset) over training; None without a schedule (the loss uses cfg's q)."""
    if cfg.q_start is None:
        return None
    q_end = cfg.loss_config().resolved(cfg.energy)["q"]
    return cfg.q_start + (q_end - cfg.q_start) * min(1.0, step / max(1, total - 1))


def batch_losses(model: StackedMLP, X: torch.Tensor, batch: Batch, cfg: TrainConfig,
                 init: Optional[list[torch.Tensor]] = None, q: Optional[float] = None) -> torch.Tensor:
    """(H,) loss of every head on its batch (plus the decay-to-init penalty when cfg asks for it).

    Anchors, positives and negatives go through the heads in one forward pass, so each layer is one
    batched matmul over all H heads x (2 + K) b rows; under cfg.precision "bf16" the matmuls run in bf16
    and the outputs are cast to fp32 before the loss (losses and their reductions stay fp32).
    q: l1-energy's Q for this step (a Q schedule, `q_at`); None = cfg's."""
    H, b = batch.anchor.shape
    rows = [batch.anchor, batch.positive] + ([batch.negative.flatten(1)] if batch.negative is not None else [])
    with autocast(cfg.precision, X.device):
        z = model(X[torch.cat(rows, dim=1)]).float()  # (H, (2 + K) b, d)
    za, zp = z[:, :b], z[:, b:2 * b]  # (H, b, d)
    zn = z[:, 2 * b:].unflatten(1, batch.negative.shape[1:]) if batch.negative is not None else None  # (H, b, K, d)
    loss_cfg = cfg.loss_config() if q is None else replace(cfg.loss_config(), q=q)
    losses = get_loss(cfg.loss)(za, zp, zn, batch.labels, energy=cfg.energy, cfg=loss_cfg,
                                same=batch.same)  # (H,)
    if cfg.decay_to_init and init is not None:
        losses = losses + cfg.decay_to_init * sum((p - p0).pow(2).flatten(1).sum(1)
                                                  for p, p0 in zip(model.parameters(), init))
    return losses


# ---------------------------------------------------------------------------- optimisation


def grad_norms(params: list[torch.Tensor]) -> torch.Tensor:
    """(H,) L2 norm of each head's whole gradient (all its parameters), one pass over the gradients."""
    return torch.stack([torch.linalg.vector_norm(p.grad.flatten(1), dim=1) for p in params]).norm(dim=0)


class StackOptimizer:
    """One optimisation step for a stack: StackedAdamW (a lr and weight decay per head) under the
    configs' warm-up schedule, per-head gradient clipping, failed heads' gradients zeroed and stopped
    heads' rates at 0. A stack without parameters (depth 0) is a no-op.

    The schedule is transformers' lambda (heads.schedule.lr_lambda) applied to every head's own rate:
    head_lr = lr_h * factor(step) * alive_h, the per-head form of a LambdaLR. The step makes few passes
    over the parameters (what bounds a stack of small heads): gradients are set to None instead of zeroed,
    the clipping factor is folded into the update, the NaN clean-up runs only when a head needs it, and a
    stack with enough work uses StackedAdamW's compiled update (`fused_pays`)."""

    def __init__(self, model: StackedMLP, configs: list[TrainConfig], total_steps: int):
        cfg = configs[0]
        self.params = list(model.parameters())
        self.init = [p.detach().clone() for p in self.params]  # for decay_to_init
        self.grad_clip = cfg.grad_clip
        self.base_lr = torch.tensor([c.lr for c in configs], dtype=torch.float64)
        self.factor = lr_lambda(cfg.schedule, warmup_steps(cfg, total_steps), total_steps)
        self.steps_taken = 0
        self.opt = None
        if self.params:
            n_params = sum(p.numel() for p in self.params)
            self.opt = StackedAdamW(self.params, lr=[c.lr for c in configs],
                                    weight_decay=[c.weight_decay for c in configs],
                                    fused=fused_pays(n_params, total_steps))

    def step(self, losses: torch.Tensor, finite: torch.Tensor, ok: torch.Tensor, alive: torch.Tensor) -> None:
        """Backward of the finite losses (H,), then one update of the heads still training (`alive`);
        heads not `ok` (failed) get zero gradients."""
        step, self.steps_taken = self.steps_taken, self.steps_taken + 1
        if self.opt is None:
            return
        torch.where(finite, losses, torch.zeros_like(losses)).sum().backward()
        norms = grad_norms(self.params)  # (H,)
        if not (bool(ok.all()) and bool(torch.isfinite(norms).all())):  # failed heads, NaN/inf gradients -> 0
            for p in self.params:
                p.grad[~ok] = 0.0
                p.grad.nan_to_num_(0.0, 0.0, 0.0)
            norms = grad_norms(self.params)
        clip = (self.grad_clip / (norms + 1e-6)).clamp(max=1.0) if self.grad_clip else None  # (H,)
        self.opt.param_groups[0]["head_lr"] = self.base_lr * self.factor(step) * alive.double()
        self.opt.step(grad_scale=clip)
        self.opt.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------------- selection


def dev_scores(task: Task, split: str, model: StackedMLP, X: torch.Tensor, cfg: TrainConfig) -> list[float]:
    """The selection metric of every head on `split` (NaN for a head whose outputs are not finite):
    one pass for all heads (heads.evaluate.selection_scores), the embeddings in cfg.precision."""
    def embed(rows):
        with autocast(cfg.precision, X.device):
            return embed_rows(model, X, rows).float()

    return selection_scores(task, split, embed, cfg.eval_energy, cfg.precision)


class HeadTracker:
    """Per head across epochs: failure, early stopping on the dev score, and the best-scoring weights.

    `alive[h]`: still training; `ok[h]`: not failed. `end_epoch` records an epoch (loss and score per head)
    and keeps head h's weights when it beats its best so far under the selection rule (heads.selection's
    `rule_key`: the dev score alone, or with out-of-domain dev losses the best dev within delta, else the
    least-losing); `patience` epochs without that stop it. `start` makes the starting point (epoch 0) the
    first candidate (the guard)."""

    def __init__(self, configs: list[TrainConfig], params: list[torch.Tensor], patience: int,
                 delta: float = 0.0):
        H = len(configs)
        self.runs = [HeadRun(c) for c in configs]
        self.params, self.patience, self.delta = params, patience, delta
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
                run.best_epoch, run.best_dev, run.best_sel_loss = 0, value, loss

    def fail(self, h: int, reason: str) -> None:
        self.runs[h].status, self.runs[h].reason = "failed", reason
        self.ok[h] = self.alive[h] = False

    def check_losses(self, losses: torch.Tensor, where: str) -> torch.Tensor:
        """Fail every still-ok head whose loss is NaN/inf ("at epoch E, step S ..." in `where`); (H,) finite."""
        finite = torch.isfinite(losses.detach())
        for h in torch.nonzero(~finite & self.ok).flatten().tolist():
            self.fail(h, f"loss became {losses[h].item()} {where}")
        return finite

    def end_epoch(self, epoch: int, losses: torch.Tensor, scores: list[float], metric: str, step: int,
                  sel_losses: Optional[list[float]] = None) -> None:
        """Record epoch `epoch` (1-based): mean loss (H,) and dev score per head (and out-of-domain dev loss);
        keep improved weights."""
        for h, value in enumerate(scores):
            run = self.runs[h]
            loss = None if sel_losses is None else float(sel_losses[h])
            run.history.append({"epoch": epoch, "loss": float(losses[h]), f"dev_{metric}": value,
                                **({"ood_dev_loss": loss} if loss is not None else {})})
            if not self.alive[h]:
                continue
            if not math.isfinite(value):  # the head's outputs overflowed or became NaN
                self.fail(h, f"dev {metric} became {value} after epoch {epoch} (global step {step})")
                continue
            key = rule_key(value, loss, self.delta)
            if key > self.best[h]:
                self.best[h], self.stale[h] = key, 0
                run.best_epoch, run.best_dev, run.best_sel_loss = epoch, value, loss
                for p, b in zip(self.params, self.best_state):
                    b[h] = p.detach()[h]
            else:
                self.stale[h] += 1
                if self.stale[h] >= self.patience:
                    self.alive[h] = False

    def best_so_far(self) -> float:
        devs = [r.best_dev for r, ok in zip(self.runs, self.ok.tolist()) if ok and math.isfinite(r.best_dev)]
        return max(devs) if devs else float("nan")

    def restore_best(self) -> None:
        """Every head's parameters set to its best-scoring epoch's."""
        with torch.no_grad():
            for p, b in zip(self.params, self.best_state):
                p.copy_(b)


# ---------------------------------------------------------------------------- the loop


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
    sampler = getattr(task, "sample_batches", None)  # labelled texts: P classes x K texts (heads.label_tasks)
    select = select_split in task.eval_sets  # no split to select on (few-shot): every epoch, keep the last
    steps_per_epoch = math.ceil(P / B)
    total = steps_per_epoch * cfg0.epochs
    optimizer = StackOptimizer(model, configs, total)
    tracker = HeadTracker(configs, optimizer.params, cfg0.patience, selection.delta if selection else 0.0)
    negatives = NegativeSource(task, data, cfg0, H)
    gens = [torch.Generator().manual_seed(c.seed) for c in configs]
    metric = primary_metric(task.kind, cfg0.eval_energy)

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
                                  q_at(cfg0, step, total))
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
