"""`cli finetune`'s training loop: encoder + head, epoch after epoch, until dev stops improving.

Each epoch: refresh the negatives cache with the current encoder (finetune_negatives.NegativeCache), one
pass over the train pairs in a seeded order (labelled texts: the kind's sampler), then dev with the
training encoder (finetune_dev.DevScorer). Stops after `patience` epochs without a dev improvement, at
`max_epochs`, or at `max_steps` (a cap for tests and smoke runs). With `keep = "best"` the best epoch's
trainable state (epoch 0, the starting point, included) is restored at the end; `keep = "last"` keeps the
final state (its dev curve still scored and recorded).

The learning rate follows the head's schedule (linear warm-up, then decay) over the PLANNED steps
(max_epochs x steps per epoch, capped by max_steps), as train-head plans its own over its epochs: a run
stopped early by dev ends where the rate still is (restoring its best epoch anyway), and every candidate of
an lr search sees the same schedule shape whatever epoch it stops at.
"""
from __future__ import annotations

import math
import sys
import time

import numpy as np
import torch

from headstore.data.progress import progress_bar
from headstore.heads.apply.finetune_dev import BestState
from headstore.heads.apply.finetune_negatives import NegativeCache, RowEncoder
from headstore.heads.kinds import kind_of
from headstore.heads.scoring.losses import get_loss
from headstore.heads.training.batches import same_mask
from headstore.heads.training.optim import lr_factor

STOP_REASONS = ("patience", "max_epochs", "max_steps")  # finetune.json "stopped_because"


class Trainer:
    """The steps of one finetune run. `unfrozen(step)` -> how many blocks train at `step` (finetune.n_unfrozen)."""

    def __init__(self, src, cfg, blocks, head, norm, opt, encoder: RowEncoder, negatives: torch.Tensor | None,
                 unfrozen, set_trainable):
        self.src, self.cfg, self.blocks, self.head, self.norm, self.opt = src, cfg, blocks, head, norm, opt
        self.encoder, self.unfrozen, self.set_trainable = encoder, unfrozen, set_trainable
        pairs, train_cfg = src.pairs, src.train_cfg
        self.n_rows = src.store.n_texts + 1
        self.B = min(cfg.batch_size or train_cfg.batch_size, len(pairs))
        self.max_epochs = cfg.max_epochs or train_cfg.epochs
        self.per_epoch = math.ceil(len(pairs) / self.B)
        self.total = self.per_epoch * self.max_epochs
        self.total = self.total if cfg.max_steps is None else min(self.total, cfg.max_steps)
        self.sched = train_cfg.replace(warmup_ratio=cfg.warmup_ratio)
        self.anchor, self.positive = torch.as_tensor(pairs.anchor), torch.as_tensor(pairs.positive)
        self.labels = None if pairs.targets is None else torch.as_tensor(pairs.targets, dtype=torch.float32)
        self.relevant = torch.as_tensor(sorted(a * self.n_rows + p for a, p in src.task.relevant), dtype=torch.long)
        self.loss_fn, self.loss_cfg = get_loss(train_cfg.loss, pairs.form), train_cfg.loss_config()
        self.cache = None if negatives is None else NegativeCache(negatives)
        self.trainable = [p for b in blocks for _, p in b] + list(head.parameters())
        self.batches = self._plan()
        self.history: list[dict] = []
        self.unfrozen_at: dict[int, int] = {}
        self.step_seconds: list[float] = []
        self.refresh_seconds: list[float] = []

    def _plan(self) -> list[torch.Tensor]:
        """Every planned step's batch: a fresh seeded permutation per epoch (the first is the one-epoch run's
        order), or the kind's sampler (labelled texts: classes x texts per batch)."""
        gen = torch.Generator().manual_seed(self.cfg.seed)
        sampler = kind_of(self.src.task).sampler(self.src.task)
        if sampler is not None:
            return list(sampler([self.src.train_cfg], [gen], self.B, self.total)[0])
        P, out = len(self.src.pairs), []
        while len(out) < self.total:
            order = torch.randperm(P, generator=gen)
            out += [order[s:s + self.B] for s in range(0, P, self.B)]
        return out[:self.total]

    def batch_loss(self, idx: torch.Tensor, neg_pooled: torch.Tensor | None) -> torch.Tensor:
        """The head's loss on pairs `idx`: anchors and positives encoded with gradients; `neg_pooled` (b, K, D)
        the negatives' sentence embeddings (the cache's), through the Normalizer and the head with gradients."""
        head, norm, device = self.head, self.norm, self.encoder.device
        a_rows, p_rows = self.anchor[idx], self.positive[idx]
        za = head.encode(norm(self.encoder(a_rows)), "query")  # (1, b, d)
        same_rows = torch.equal(a_rows, p_rows) and head.cfg.sides == "both"  # labelled texts: anchor = positive
        zp = za if same_rows else head.encode(norm(self.encoder(p_rows)), "document")
        zn = None
        if neg_pooled is not None:
            zn = head.encode(norm(neg_pooled.flatten(0, 1)), "document").unflatten(1, neg_pooled.shape[:2])
        labels = self.labels[idx].unsqueeze(0).to(device) if self.labels is not None else None  # (1, b[, L])
        same = same_mask(a_rows, p_rows, self.relevant, self.n_rows).to(device)  # (b, b)
        train_cfg = self.src.train_cfg
        return self.loss_fn(za.float(), zp.float(), None if zn is None else zn.float(), labels,
                            energy=train_cfg.energy, cfg=self.loss_cfg, same=same)[0]

    def step(self, step: int, epoch: int) -> float:
        t0 = time.perf_counter()
        k = self.unfrozen(step)
        if k not in self.unfrozen_at.values():
            self.set_trainable(self.blocks, k)
            self.unfrozen_at[step] = k
        idx = self.batches[step]
        loss = self.batch_loss(idx, None if self.cache is None else self.cache(idx))
        if not torch.isfinite(loss):
            raise RuntimeError(f"finetune: loss became {loss.item()} at step {step + 1}; lower --encoder-lr")
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_([p for p in self.trainable if p.grad is not None], self.cfg.grad_clip)
        factor = lr_factor(step, self.total, self.sched)
        for g in self.opt.param_groups:
            g["lr"] = g["base_lr"] * factor
        self.opt.step()
        self.encoder.version += 1  # the encoder changed: no-grad embeddings of the old one are stale
        self.history.append({"step": step + 1, "epoch": epoch, "loss": float(loss.detach()), "unfrozen_blocks": k})
        self.step_seconds.append(time.perf_counter() - t0)
        return self.history[-1]["loss"]

    def refresh(self) -> None:
        if self.cache is not None:
            t0 = time.perf_counter()
            self.cache.refresh(self.encoder)
            self.refresh_seconds.append(time.perf_counter() - t0)

    def run(self, dev, progress: bool) -> dict:
        """Epochs until dev stops improving (module doc); `dev` () -> float, or None (no dev split: every
        epoch runs and the last state is kept). The record finetune.json keeps."""
        best = BestState(self.trainable, self.cfg.patience)
        say = (lambda text: print(f"finetune ({self.cfg.setup}): {text}", file=sys.stderr, flush=True)) \
            if progress else (lambda text: None)
        if dev is not None:
            best.record(0, dev())
            say(f"epoch 0 (the start): dev {dev.metric} {best.curve[-1]['dev']:.4f} ({dev.seconds[-1]:.0f} s)")
        bar = progress_bar(total=self.total, desc=f"finetune ({self.cfg.setup}, {self.cfg.unfreeze})",
                           disable=not progress)
        step, epoch, stopped = 0, 0, "max_epochs"
        while epoch < self.max_epochs:
            epoch += 1
            self.refresh()
            if self.cache is not None:
                say(f"epoch {epoch}: {len(self.cache):,} negatives cached ({self.refresh_seconds[-1]:.0f} s)")
            losses, stop = [], min(step + self.per_epoch, self.total)
            while step < stop:
                losses.append(self.step(step, epoch))
                step += 1
                bar.update(1)
                bar.set_postfix(epoch=epoch, loss=f"{losses[-1]:.4f}")
            if dev is not None:
                best.record(epoch, dev(), float(np.mean(losses)))
                say(f"epoch {epoch}: dev {best.curve[-1]['dev']:.4f}, best {best.best_value:.4f} at epoch "
                    f"{best.best_epoch} ({dev.seconds[-1]:.0f} s)")
                if best.exhausted:
                    stopped = "patience"
                    break
            if step >= self.total and epoch < self.max_epochs:
                stopped = "max_steps"
                break
        bar.close()
        if self.cfg.keep == "best":
            best.restore()
        return self._record(best, dev, epoch, step, stopped)

    def _record(self, best: BestState, dev, epochs: int, steps: int, stopped: str) -> dict:
        assert stopped in STOP_REASONS, stopped
        return {"steps": steps, "epochs_run": epochs, "steps_per_epoch": self.per_epoch,
                "planned_steps": self.total, "max_epochs": self.max_epochs, "stopped_because": stopped,
                "dev_metric": None if dev is None else dev.metric, "dev_set": None if dev is None else dev.describe(),
                "dev_curve": best.curve,
                "best_epoch": best.best_epoch if dev is not None else epochs,
                "kept_epoch": best.best_epoch if dev is not None and self.cfg.keep == "best" else epochs,
                "best_dev": best.best_value if dev is not None and best.best_epoch >= 0 else None,
                "negatives": {"per_pair": 0 if self.cache is None else int(self.cache.index.shape[1]),
                              "unique_cached": 0 if self.cache is None else len(self.cache),
                              "cache_mb": 0.0 if self.cache is None else round(self.cache.megabytes(), 2)},
                "timing": {"train_step_s": _mean(self.step_seconds), "cache_refresh_s": self.refresh_seconds,
                           "dev_s": [] if dev is None else dev.seconds}}


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None
