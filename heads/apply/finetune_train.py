"""`cli finetune`'s training loop: encoder + head, epoch after epoch, until dev stops improving.

Each epoch: refresh the negatives cache with the current encoder (finetune_negatives.NegativeCache), one
pass over the train pairs in a seeded order (labelled texts: the kind's sampler), then dev with the
training encoder (finetune_dev.DevScorer). Stops after `patience` epochs without a dev improvement, at
`max_epochs`, or at `max_steps` (a cap for tests and smoke runs). With `keep = "best"` the best epoch's
trainable state (epoch 0, the starting point, included) is restored at the end; `keep = "last"` keeps the
final state (its dev curve still scored and recorded). Given a checkpoint (finetune_resume), every epoch's
state is written after its dev scoring, and a run that finds its own goes on from there, bit for bit.

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

    def run(self, dev, progress: bool, checkpoint=None) -> dict:
        """Epochs until dev stops improving (module doc); `dev` () -> float, or None (no dev split: every
        epoch runs and the last state is kept). `checkpoint` (finetune_resume.Checkpoint, optional): resumed
        from when it holds this run's state, written after every epoch. The record finetune.json keeps."""
        best = BestState(self.trainable, self.cfg.patience)
        say = (lambda text: print(f"finetune ({self.cfg.setup}): {text}", file=sys.stderr, flush=True)) \
            if progress else (lambda text: None)
        step, epoch = 0, 0
        state = None if checkpoint is None else checkpoint.load()
        if state is not None:  # said whatever `progress` says: the run goes on from there, not from the start
            step, epoch = self.load_state(state, best, dev)
            print(f"finetune ({self.cfg.setup}): resuming from epoch {epoch} (step {step} of {self.total}; "
                  f"{checkpoint.path})", file=sys.stderr, flush=True)
        elif dev is not None:
            best.record(0, dev())
            say(f"epoch 0 (the start): dev {dev.metric} {best.curve[-1]['dev']:.4f} ({dev.seconds[-1]:.0f} s)")
        bar = progress_bar(total=self.total, initial=step, desc=f"finetune ({self.cfg.setup}, {self.cfg.unfreeze})",
                           disable=not progress)
        stopped = self._stopped(best, dev, epoch, step)
        while stopped is None:
            epoch += 1
            step, losses = self._epoch(epoch, step, bar, say)
            if dev is not None:
                best.record(epoch, dev(), float(np.mean(losses)))
                say(f"epoch {epoch}: dev {best.curve[-1]['dev']:.4f}, best {best.best_value:.4f} at epoch "
                    f"{best.best_epoch} ({dev.seconds[-1]:.0f} s)")
            if checkpoint is not None:
                checkpoint.save(self.state(best, dev, epoch, step))
            stopped = self._stopped(best, dev, epoch, step)
        bar.close()
        if self.cfg.keep == "best":
            best.restore()
        return self._record(best, dev, epoch, step, stopped)

    def _epoch(self, epoch: int, step: int, bar, say) -> tuple[int, list[float]]:
        """Epoch `epoch` from `step`: the negatives cache refreshed, then its steps; (the next step, losses)."""
        self.refresh()
        if self.cache is not None:
            say(f"epoch {epoch}: {len(self.cache):,} negatives cached ({self.refresh_seconds[-1]:.0f} s)")
        losses, stop = [], min(step + self.per_epoch, self.total)
        while step < stop:
            losses.append(self.step(step, epoch))
            step += 1
            bar.update(1)
            bar.set_postfix(epoch=epoch, loss=f"{losses[-1]:.4f}")
        return step, losses

    def _stopped(self, best: BestState, dev, epoch: int, step: int) -> str | None:
        """Why the run stops after epoch `epoch` (a STOP_REASONS), or None when another epoch runs."""
        if dev is not None and best.exhausted:
            return "patience"
        if epoch >= self.max_epochs:
            return "max_epochs"
        return "max_steps" if step >= self.total else None

    def state(self, best: BestState, dev, epoch: int, step: int) -> dict:
        """Everything `run` needs to go on after epoch `epoch` bit for bit (finetune_resume's module doc)."""
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
        return {"epoch": epoch, "step": step, "trainable": [p.detach().cpu() for p in self.trainable],
                "optimizer": self.opt.state_dict(), "rng": {"cpu": torch.get_rng_state(), "cuda": cuda},
                "best": best.state(epoch), "encoder": self.encoder.state(), "history": self.history,
                "unfrozen_at": self.unfrozen_at, "timing": {"step": self.step_seconds,
                "refresh": self.refresh_seconds, "dev": [] if dev is None else dev.seconds}}

    def load_state(self, state: dict, best: BestState, dev) -> tuple[int, int]:
        """The run as `state` left it; (step, epoch) to go on from."""
        assert len(state["trainable"]) == len(self.trainable), "a checkpoint of another run (finetune_resume.run_key)"
        with torch.no_grad():
            for p, saved in zip(self.trainable, state["trainable"]):
                assert p.shape == saved.shape, (p.shape, saved.shape)
                p.copy_(saved)
        self.opt.load_state_dict(state["optimizer"])
        best.load(state["best"])
        self.encoder.load(state["encoder"])
        self.history, self.unfrozen_at = list(state["history"]), dict(state["unfrozen_at"])
        self.step_seconds, self.refresh_seconds = list(state["timing"]["step"]), list(state["timing"]["refresh"])
        if dev is not None:
            dev.seconds = list(state["timing"]["dev"])
        if self.unfrozen_at:  # the blocks training at the last step (step() sets them only when k changes)
            self.set_trainable(self.blocks, self.unfrozen_at[max(self.unfrozen_at)])
        torch.set_rng_state(state["rng"]["cpu"])  # last: nothing after it draws before the next step
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        return int(state["step"]), int(state["epoch"])

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
