"""One optimisation step of a stack: StackedAdamW (a lr and weight decay per head) under the plan's
warm-up schedule (transformers' schedules, heads.schedule), per-head gradient clipping."""
from __future__ import annotations

import torch

from headstore.heads.network.model import StackedMLP
from headstore.featurize.tuning.schedule import lr_lambda
from headstore.heads.training.resolved import ResolvedTraining
from headstore.heads.training.stacked_adamw import StackedAdamW


def warmup_steps(warmup_ratio: float, total: int) -> int:
    """Warm-up updates of a run of `total` updates: warmup_ratio of them, rounded."""
    return int(round(warmup_ratio * total))


def lr_factor(step: int, total: int, sched) -> float:
    """Factor of the peak lr at update `step` of `total` under `sched`'s schedule and warmup_ratio (a
    ResolvedTraining, or any settings holding both; heads.schedule: transformers' warm-up schedules, the warm-up
    counting the update being taken)."""
    return lr_lambda(sched.schedule, warmup_steps(sched.warmup_ratio, total), total)(step)


def grad_norms(params: list[torch.Tensor]) -> torch.Tensor:
    """(H,) L2 norm of each head's whole gradient (all its parameters), one pass over the gradients."""
    return torch.stack([torch.linalg.vector_norm(p.grad.flatten(1), dim=1) for p in params]).norm(dim=0)


class StackOptimizer:
    """One optimisation step for a stack: StackedAdamW (a lr and weight decay per head) under the
    plan's warm-up schedule, per-head gradient clipping, failed heads' gradients zeroed and stopped
    heads' rates at 0. A stack without parameters (depth 0) is a no-op.

    The schedule is transformers' lambda (heads.schedule.lr_lambda) applied to every head's own rate:
    head_lr = lr_h * factor(step) * alive_h, the per-head form of a LambdaLR. The step makes few passes
    over the parameters (what bounds a stack of small heads): gradients are set to None instead of zeroed,
    the clipping factor is folded into the update, the NaN clean-up runs only when a head needs it, and each head
    still training is updated by torch's fused AdamW kernel (StackedAdamW), the others not at all."""

    def __init__(self, model: StackedMLP, plan: ResolvedTraining, total_steps: int):
        self.params = list(model.parameters())
        self.init = [p.detach().clone() for p in self.params] if plan.decay_to_init else None  # decay_to_init's
        self.grad_clip = plan.grad_clip
        self.base_lr = torch.tensor(plan.lrs, dtype=torch.float64)
        self.warmup = warmup_steps(plan.warmup_ratio, total_steps)
        self.factor = lr_lambda(plan.schedule, self.warmup, total_steps)
        self.steps_taken = 0
        self.opt = None
        if self.params:
            self.opt = StackedAdamW(self.params, lr=list(plan.lrs), weight_decay=list(plan.weight_decays))

    def keep_heads(self, keep: list[int], model: StackedMLP) -> None:
        """Go on with the heads at positions `keep` only, whose rows `model` now holds (a copy of them:
        heads.training.train.StackTraining.compact): their rates, decay-to-init starts and AdamW state carried over."""
        self.params = list(model.parameters())
        idx = torch.as_tensor(keep, dtype=torch.long)
        self.base_lr = self.base_lr[idx]
        if self.init is not None:
            self.init = [p0.index_select(0, idx.to(p0.device)) for p0 in self.init]
        if self.opt is not None:
            self.opt = self.opt.select_heads(keep, self.params)

    def step(self, losses: torch.Tensor, finite: torch.Tensor, ok: torch.Tensor, alive: torch.Tensor) -> None:
        """Backward of the finite losses (H,), then one update of the heads still training (`alive`);
        heads not `ok` (failed) get zero gradients."""
        step, self.steps_taken = self.steps_taken, self.steps_taken + 1
        if self.opt is None:
            return
        torch.where(finite.to(losses.device), losses, torch.zeros_like(losses)).sum().backward()
        norms = grad_norms(self.params)  # (H,)
        if not (bool(ok.all()) and bool(torch.isfinite(norms).all())):  # failed heads, NaN/inf gradients -> 0
            for p in self.params:
                p.grad[~ok.to(p.device)] = 0.0
                p.grad.nan_to_num_(0.0, 0.0, 0.0)
            norms = grad_norms(self.params)
        clip = (self.grad_clip / (norms + 1e-6)).clamp(max=1.0) if self.grad_clip else None  # (H,)
        self.opt.param_groups[0]["head_lr"] = self.base_lr * self.factor(step) * alive.double()
        self.opt.step(grad_scale=clip, heads=alive)
        self.opt.zero_grad(set_to_none=True)
