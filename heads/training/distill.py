"""A student head trained on a teacher's soft targets (heads.training.distill_targets), train-head's loop otherwise.

`DistillTraining` is a `StackTraining` (heads.training.train) whose epochs run over the targets' anchors instead
of the training pairs: each step takes a batch of anchors per head (each head's own order, from its seed), the
student's energies of each anchor against its candidates, and the distillation losses of `DistillConfig` (KL
and/or Margin-MSE: heads.scoring.losses.distill) against the teacher's energies (embedding-MSE: the anchors'
outputs against the teacher's); with `pair_weight` > 0 it adds
train-head's own loss on a batch of the training pairs (its mined negatives, anchor regulariser and
decay-to-init as train-head's), drawn in turn from each head's permutation of the pairs. Everything else is
train-head's: the normaliser fitted on the training texts, dev scored each epoch, early stopping, the guard
(the starting point is a candidate), the kept best epoch, several seeds as one stack.
"""
from __future__ import annotations

from typing import Optional

import torch

from headstore.heads.kinds import Task
from headstore.heads.network.features import Normalizer
from headstore.heads.network.model import StackedMLP
from headstore.heads.scoring.energy import candidate_energy
from headstore.heads.scoring.losses import distill_losses
from headstore.heads.scoring.losses.distill import teacher_spread
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.settings.distill import DistillConfig
from headstore.heads.training.anchor import AnchorPool
from headstore.heads.training.batches import epoch_batches, forward_rows, n_batches
from headstore.heads.training.distill_targets import Targets
from headstore.heads.training.resolved import ResolvedTraining, as_plan
from headstore.heads.training.train import StackTraining, TrainingDiverged, run_epochs
from headstore.heads.training.tracker import HeadRun


class DistillTraining(StackTraining):
    """One stack's distillation (module doc). `targets`: at task positions (rows of `features`)."""

    compacts = False  # its pair generators are per head of the whole stack: stopped heads stay in the steps

    def __init__(self, task: Task, features: torch.Tensor, head_cfg: HeadConfig, plan: ResolvedTraining,
                 dcfg: DistillConfig, targets: Targets, anchor_rows: Optional[AnchorPool] = None,
                 in_place: bool = False, init: Optional[tuple[StackedMLP, Normalizer]] = None):
        self.dcfg, self.U = dcfg, len(targets)
        dev = features.device
        self.t_anchor = torch.as_tensor(targets.anchors, dtype=torch.long, device=dev)  # (U,)
        self.t_cand = torch.as_tensor(targets.candidates, dtype=torch.long, device=dev)  # (U, C)
        self.t_energy = torch.as_tensor(targets.energies, dtype=torch.float32, device=dev)  # (U, C)
        self.t_valid = torch.as_tensor(targets.valid, dtype=torch.bool, device=dev)  # (U, C)
        specs = distill_losses(dcfg.distill_loss)
        self.losses = [(spec.function(), spec.name) for spec in specs if spec.reads == "energies"]
        self.embedding_losses = [spec.function() for spec in specs if spec.reads == "embeddings"]
        assert not self.embedding_losses or targets.embeddings is not None, "an embedding loss without embeddings"
        self.t_embed = None if not self.embedding_losses else torch.as_tensor(targets.embeddings, device=dev)  # (U, d)
        self.t_spread = teacher_spread(self.t_embed) if self.embedding_losses else None  # of all U anchors, once
        if self.t_spread is not None and not self.t_spread > 0:
            raise ValueError(f"--distill-loss {dcfg.distill_loss}: the teacher gives all {self.U} anchors the same "
                             "output (no variance to regress onto); drop embedding-mse")
        super().__init__(task, features, head_cfg, plan, "dev", None, init,
                         anchor_rows if dcfg.pair_weight else None, in_place)
        self.pair_gens = [torch.Generator().manual_seed(seed + 1) for seed in plan.seeds]
        self.pair_blocks: list[torch.Tensor] = []

    def epoch_steps(self) -> int:
        return n_batches(self.U, self.B)

    def epoch_negatives(self, epoch: int, trained: torch.Tensor) -> Optional[torch.Tensor]:
        return super().epoch_negatives(epoch, trained) if self.dcfg.pair_weight else None

    def epoch_batches(self):
        """Each head's permutation of the anchors, cut into (H, b) blocks."""
        return epoch_batches(self.gens, self.U, self.B)

    def step_losses(self, idx: torch.Tensor, negs: Optional[torch.Tensor]) -> torch.Tensor:
        losses = self.distill_losses(idx)
        if self.dcfg.pair_weight:
            losses = losses + self.dcfg.pair_weight * super().step_losses(self._pair_block(), negs)
        return losses

    def _pair_block(self) -> torch.Tensor:
        """The next (H, b) block of training pairs, each head's permutations one after another."""
        if not self.pair_blocks:
            self.pair_blocks = epoch_batches(self.pair_gens, self.P, self.B)
        return self.pair_blocks.pop(0).to(self.data.X.device)

    def distill_losses(self, idx: torch.Tensor) -> torch.Tensor:
        """(H,) the distillation losses of the anchors idx (H, b) against their candidates."""
        b = idx.shape[1]
        cand = self.t_cand[idx]  # (H, b, C)
        rows = torch.cat([self.t_anchor[idx], cand.flatten(1)], dim=1) if self.losses else self.t_anchor[idx]
        z = forward_rows(self.model, self.data.X, rows, b, self.plan.precision)  # (H, b [+ b C], d)
        losses = torch.zeros(z.shape[0], device=z.device)
        if self.losses:  # over the candidate sets: (H, b, C) energies
            E = candidate_energy(self.plan.eval_energy, z[:, :b], z[:, b:].unflatten(1, cand.shape[1:]))
            target, valid = self.t_energy[idx], self.t_valid[idx]
            losses = losses + sum(fn(E, target, valid, temperature=self.dcfg.temperature) for fn, _ in self.losses)
        for fn in self.embedding_losses:  # the anchors' outputs against the teacher's: (H, b, d) and (b, d)
            losses = losses + fn(z[:, :b], self.t_embed[idx], spread=self.t_spread)
        return losses


def distill_stack(task: Task, features: torch.Tensor, head_cfg: HeadConfig,
                  configs: ResolvedTraining | list[TrainConfig],
                  dcfg: DistillConfig, targets: Targets, progress: bool = True,
                  anchor_rows: Optional[AnchorPool] = None, in_place: bool = False,
                  init: Optional[tuple[StackedMLP, Normalizer]] = None) -> tuple[StackedMLP, Normalizer, list[HeadRun]]:
    """Distil into a stack of heads of one shape (seeds, lrs) together: train_stack's loop on the targets;
    `configs`: their settings resolved (heads.training.resolved), or one TrainConfig per head, resolved here;
    `init`: the heads' starting weights and normaliser (a stack of that many heads of head_cfg)."""
    plan = as_plan(configs)  # checks the stack shares what it must
    if "dev" not in task.eval_sets:
        raise ValueError(f"{task.name}: no dev split to select the distilled head's epoch on")
    run = DistillTraining(task, features, head_cfg, plan, dcfg, targets, anchor_rows, in_place, init)
    model, norm, runs = run_epochs(run, plan.epochs, f"{run.H} head(s) distilled ({dcfg.distill_loss})",
                                   progress)
    failed = [r for r in runs if r.status == "failed"]
    if failed:
        raise TrainingDiverged(f"{task.name}: distillation stopped: {failed[0].reason}; lower --lr or the "
                               "--temperature's sharpness")
    return model, norm, runs
