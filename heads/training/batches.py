"""What one training step of a stack reads: the training data as tensors, each epoch's batches and
negatives, and every head's loss on a batch.

- `prepare_data`: the normalised features and the task kind's training set as tensors (`TrainingData`);
- `epoch_batches`: each head's batches of one epoch, from its own generator (labelled texts sample their own:
  the kind's sampler);
- `NegativeSource`: given and mined negatives of every pair (mined once, or each epoch with --remine);
- `make_batch` + `batch_losses`: the rows of one step and every head's loss on them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
import math
from typing import Optional

import numpy as np
import torch

from headstore.heads.training.anchor import anchor_penalty
from headstore.heads.network.candidates import frozen_topk
from headstore.heads.training.resolved import ResolvedTraining
from headstore.heads.evaluation.evaluate import embedder
from headstore.heads.network.features import Normalizer
from headstore.heads.kinds import Task, TrainSet, kind_of
from headstore.heads.scoring.losses import LOSSES, get_loss
from headstore.heads.evaluation.mining import MiningPlan, mine
from headstore.heads.network.model import StackedMLP, autocast


def same_mask(a: torch.Tensor, p: torch.Tensor, relevant: torch.Tensor, n_rows: int) -> torch.Tensor:
    """(H, B, B): True where in-batch pair (a_i, p_j) must not be an impostor.

    Duplicate anchors or positives within a batch, and known relevant pairs, are never pushed apart."""
    code = a.unsqueeze(-1) * n_rows + p.unsqueeze(-2)  # (H, B, B)
    known = torch.isin(code, relevant) if relevant.numel() else torch.zeros_like(code, dtype=torch.bool)
    return (a.unsqueeze(-1) == a.unsqueeze(-2)) | (p.unsqueeze(-1) == p.unsqueeze(-2)) | known


@dataclass(frozen=True)
class TrainingData:
    """What a stack trains on: the features the heads read and the training pairs, as tensors.

    Rows are store rows; `X[rows]` is what a head's forward pass takes (a head with another input,
    e.g. several layers per text, only needs X to hold that input per row)."""

    X: torch.Tensor  # (N, D) features after the normaliser
    norm: Normalizer  # fitted on the training texts only
    pairs: TrainSet  # what the task's kind gives the loss to train on (heads.kinds)
    anchor: torch.Tensor  # (P,) int64 store rows
    positive: torch.Tensor  # (P,) int64
    labels: Optional[torch.Tensor]  # (P,) float32 pair labels / STS scores, (P, L) label codes, or None
    given: Optional[torch.Tensor]  # (P, K) int64 given negatives the loss uses, or None
    relevant: torch.Tensor  # sorted codes anchor * code_base + positive of known relevant pairs
    code_base: int  # len(X) + 1

    def __len__(self) -> int:
        return len(self.anchor)


NORM_CHUNK = 1 << 16  # rows normalised at a time when the features are normalised in place


def prepare_data(task: Task, features: torch.Tensor, loss: str, normalize: str, blocks: int = 1,
                 norm: Optional[Normalizer] = None, in_place: bool = False) -> TrainingData:
    """Training set of `loss` (the task kind's), the `normalize` normaliser fitted on its texts, the normalised
    features. blocks: stored arrays side by side in `features` (a mixing head), each L2-normalised on its own.
    norm: a normaliser to keep instead (heads that go on training keep the one they were trained with).
    in_place: normalise `features` itself, block by block (the same numbers, row by row; no second copy of the
    features: the caller no longer needs the raw ones, heads.training.run scores the frozen baseline first)."""
    pairs = kind_of(task).train_set(task, loss)
    fit_rows = np.unique(np.concatenate([pairs.anchor, pairs.positive]))
    if norm is None:
        norm = Normalizer.fit(normalize, features[torch.as_tensor(fit_rows)], blocks=blocks)
    if in_place:
        for s in range(0, len(features), NORM_CHUNK):
            features[s:s + NORM_CHUNK] = norm(features[s:s + NORM_CHUNK])
    X = features if in_place else norm(features)  # (N, D)
    base, dev = len(X) + 1, X.device  # the pairs' tensors live where the features do (a GPU, or the CPU)
    relevant = torch.as_tensor(sorted(a * base + p for a, p in task.relevant), dtype=torch.long, device=dev)
    use_given = pairs.negative is not None and LOSSES[loss].negatives
    labels = None if pairs.targets is None else torch.as_tensor(pairs.targets, dtype=torch.float32, device=dev)
    return TrainingData(X, norm, pairs, torch.as_tensor(pairs.anchor, device=dev),
                        torch.as_tensor(pairs.positive, device=dev), labels,
                        torch.as_tensor(pairs.negative, device=dev) if use_given else None, relevant, base)


def n_batches(n_rows: int, batch_size: int) -> int:
    """Batches of one epoch over n_rows (epoch_batches): ceil(n / b), less one where the remainder is a single row."""
    return max(1, math.ceil(n_rows / batch_size) - (n_rows > batch_size and n_rows % batch_size == 1))


def epoch_batches(gens: list[torch.Generator], n_pairs: int, batch_size: int) -> list[torch.Tensor]:
    """One epoch's batches: a permutation of the pairs per head from its own generator, cut into
    (H, b) index blocks (the last block holds the remainder). A remainder of one row joins the block before it
    (b + 1 rows): a batch of one has no in-batch impostor and no spread (the batch size is >= 2 for that reason)."""
    perms = torch.stack([torch.randperm(n_pairs, generator=g) for g in gens])  # (H, P)
    blocks = list(perms.split(batch_size, dim=1))
    if len(blocks) > 1 and blocks[-1].shape[1] == 1:
        blocks[-2:] = [torch.cat(blocks[-2:], dim=1)]
    assert len(blocks) == n_batches(n_pairs, batch_size)
    return blocks


class NegativeSource:
    """Negatives of every training pair for an epoch: given ones, then mined ones, (H, P, K) store rows.

    Mined once in feature space (cosine over the stored features, shared by all heads), or with
    remine re-mined each epoch after the first (every remine_every epochs) in each head's own space with
    its own energy (the plan's `negatives` section and eval_energy)."""

    def __init__(self, task: Task, data: TrainingData, plan: ResolvedTraining, n_heads: int):
        neg = plan.negatives
        self.task, self.data, self.neg, self.energy, self.n_heads = task, data, neg, plan.eval_energy, n_heads
        self.mining = bool(neg.mined_k and LOSSES[plan.loss].negatives and task.corpus_rows is not None)
        self.mined: Optional[torch.Tensor] = None  # (H, P, k)
        self.pool, self.report = None, {"method": "exact"}
        self.plan = (MiningPlan.build(data.pairs.anchor, task.corpus_rows, task.relevant, neg.mined_k)
                     if self.mining else None)  # the corpus, anchors and positives, once for every epoch
        n_docs = len(self.plan.corpus_rows) if self.mining else 0
        if self.mining and neg.on_candidates(n_docs):  # a large corpus: a candidate pool, searched once
            self.pool = self._pool(n_docs)
            self.report = {"method": "candidates", "pool_k": int(self.pool.shape[1]), "search": "each training "
                           "query's exact frozen top pool_k by cosine (blocked matmul), searched once", "corpus": n_docs,
                           "exact_max": neg.exact_max}
        elif self.mining:
            self.report["corpus"] = n_docs
        if self.mining and neg.remine and neg.remine_every != 1:
            self.report["remine_every"] = neg.remine_every

    def _remine(self, model: StackedMLP, heads: Optional[torch.Tensor]) -> None:
        """Re-mine the negatives of `heads` (None: all) in each one's own space."""
        idx = list(range(self.n_heads)) if heads is None else torch.nonzero(heads).flatten().tolist()
        if not idx:
            return
        some = len(idx) < self.n_heads
        fresh = mine(self.plan, self.data.X, embedder(model.select_heads(idx) if some else model, self.data.X),
                     len(idx), energy=self.energy, pool=self.pool).to(self.data.X.device)  # (h, P, k)
        if not some:
            self.mined = fresh
            return
        self.mined = self.mined.contiguous()  # the feature-space negatives are one (P, k) expanded to H heads
        self.mined[torch.as_tensor(idx, device=fresh.device)] = fresh

    def keep_heads(self, keep: list[int]) -> None:
        """Go on with the heads at positions `keep` only (heads.training.train.StackTraining.compact)."""
        self.n_heads = len(keep)
        if self.mined is not None:  # the feature-space negatives stay one (P, k) expanded to the heads
            self.mined = (self.mined[:1].expand(len(keep), -1, -1) if self.mined.stride(0) == 0
                          else self.mined[torch.as_tensor(keep, device=self.mined.device)])

    def _pool(self, n_docs: int) -> np.ndarray:
        """(U, c) candidates of every unique anchor: its frozen top-c by cosine (c = pool_k, plus room for
        the anchor's own positives, which are never mined)."""
        c = min(n_docs, max(self.neg.pool_k, self.neg.mined_k) + max(map(len, self.plan.exclude), default=0))
        return frozen_topk(self.data.X, self.plan.anchors, self.plan.corpus_rows, c)

    def for_epoch(self, epoch: int, model: StackedMLP, heads: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """(H, P, K) negatives for epoch `epoch` (0-based), or None when the loss uses none. `heads` (H,) bool: the
        heads re-mined in their own space (None: all); the others (stopped: their weights no longer change) keep
        the negatives they last had."""
        neg, data = self.neg, self.data
        given = data.given.unsqueeze(0).expand(self.n_heads, -1, -1) if data.given is not None else None
        if self.mining and (self.mined is None or (neg.remine and epoch % neg.remine_every == 0)):
            if neg.remine and epoch > 0:
                self._remine(model, heads)
            else:
                self.mined = mine(self.plan, data.X, None, self.n_heads, energy=self.energy,
                                  pool=self.pool).to(data.X.device)
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


def forward_rows(model: StackedMLP, X: torch.Tensor, rows: torch.Tensor, n_queries: int, precision: str) -> torch.Tensor:
    """(H, n, d) fp32 outputs of a step's rows (H, n), the first `n_queries` of each head the anchors (queries),
    the rest positives and negatives (documents): all through the heads in one pass, or, for a query-side head,
    the anchors only (documents keep their features: E(q, d) = ||f(q) - n(d)||)."""
    if model.cfg.sides == "both":
        with autocast(precision, X.device):
            return model(X[rows]).float()
    with autocast(precision, X.device):
        za = model(X[rows[:, :n_queries]]).float()  # (H, b, d)
    return torch.cat([za, model.encode(X[rows[:, n_queries:]], "document").float()], dim=1)


def batch_losses(model: StackedMLP, X: torch.Tensor, batch: Batch, plan: ResolvedTraining,
                 init: Optional[list[torch.Tensor]] = None, q: Optional[float] = None,
                 form: str = "positives", anchor: Optional[torch.Tensor] = None,
                 groups: tuple[int, ...] = ()) -> torch.Tensor:
    """(H,) loss of every head on its batch (plus the decay-to-init penalty when the plan asks for it).

    Anchors, positives and negatives go through the heads in one forward pass, so each layer is one
    batched matmul over all H heads x (2 + K) b rows; under the plan's precision "bf16" the matmuls run in bf16
    and the outputs are cast to fp32 before the loss (losses and their reductions stay fp32).
    q: l1-energy's Q for this step (a Q schedule, ResolvedTraining.q_at); None = the plan's loss_config's. form: the training data's form
    (heads.scoring.losses.FORMS), which picks the loss's function. anchor: (H, m) store rows of the anchor on the
    unlabeled store (heads.training.anchor), weighted by the plan's anchor_weight. groups: the label codes' blocks, one
    softmax each for a classifier head on a label tree (heads.kinds.labels.LabelTrainSet)."""
    H, b = batch.anchor.shape
    rows = [batch.anchor, batch.positive] + ([batch.negative.flatten(1)] if batch.negative is not None else [])
    z = forward_rows(model, X, torch.cat(rows, dim=1), b, plan.precision)  # (H, (2 + K) b, d)
    za, zp = z[:, :b], z[:, b:2 * b]  # (H, b, d)
    zn = z[:, 2 * b:].unflatten(1, batch.negative.shape[1:]) if batch.negative is not None else None  # (H, b, K, d)
    loss_cfg = plan.loss_config if q is None else replace(plan.loss_config, q=q)
    if groups:
        loss_cfg = replace(loss_cfg, groups=tuple(groups))
    losses = get_loss(plan.loss, form)(za, zp, zn, batch.labels, energy=plan.energy, cfg=loss_cfg,
                                      same=batch.same)  # (H,)
    if plan.decay_to_init and init is not None:
        losses = losses + plan.decay_to_init * sum((p - p0).pow(2).flatten(1).sum(1)
                                                  for p, p0 in zip(model.parameters(), init))
    if plan.anchor_weight and anchor is not None:
        with autocast(plan.precision, X.device):
            losses = losses + plan.anchor_weight * anchor_penalty(model, X[anchor])
    return losses
