"""AdamW for stacked heads: a learning rate and weight decay per head.

torch.optim.AdamW takes one lr per parameter group, but a stacked parameter (H, ...) holds all H
heads in one tensor. StackedAdamW keeps lr and weight_decay as (H,) tensors and broadcasts them
over each parameter's leading head axis; the update is otherwise torch.optim.AdamW's
(decoupled weight decay, bias-corrected moments), so head h follows exactly the trajectory it would
under torch.optim.AdamW(lr=lr[h], weight_decay=weight_decay[h]) trained on its own.

LR schedulers: torch schedulers need a scalar group["lr"], so the per-head rates live in
group["head_lr"] and the effective rate of head h is group["lr"] * group["head_lr"][h]. Given a
per-head lr, the constructor sets group["lr"] = 1.0 (a schedule factor) and head_lr = lr; given a
float, group["lr"] = lr and head_lr = 1. Multiplicative schedules (LambdaLR, CosineAnnealingLR,
LinearLR, ...) therefore scale every head's rate alike.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence, Union

import torch

PerHead = Union[float, Sequence[float], torch.Tensor]


def _per_head(value: PerHead, name: str) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.float64).detach().clone()
    if t.dim() > 1 or bool((t < 0).any()):
        raise ValueError(f"StackedAdamW {name} must be a float or a 1-D sequence of per-head values >= 0; got {value}")
    return t


class StackedAdamW(torch.optim.Optimizer):
    """AdamW whose `lr` and `weight_decay` may be (H,) tensors, one value per head.

    Every parameter must have the head axis first (shape (H, ...)). A float applies to all heads.
    Parameter groups work as in torch (e.g. a group with weight_decay=0 for biases)."""

    def __init__(self, params: Iterable, lr: PerHead = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: PerHead = 1e-2):
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0 or eps < 0:
            raise ValueError(f"StackedAdamW: need 0 <= betas < 1 and eps >= 0; got betas={betas}, eps={eps}")
        head_lr = _per_head(lr, "lr")
        base_lr = 1.0 if head_lr.dim() == 1 else float(head_lr)
        defaults = dict(lr=base_lr, head_lr=head_lr / base_lr if base_lr else head_lr, betas=betas, eps=eps,
                        weight_decay=_per_head(weight_decay, "weight_decay"))
        super().__init__(params, defaults)

    @staticmethod
    def _broadcast(value, p: torch.Tensor, name: str) -> torch.Tensor:
        """(H,) or scalar -> shape (H, 1, ..., 1) on p's device and dtype."""
        v = torch.as_tensor(value, dtype=torch.float64)
        if v.dim() == 0:
            return v.to(device=p.device, dtype=p.dtype)
        if v.shape[0] != p.shape[0]:
            raise ValueError(f"StackedAdamW {name} has {v.shape[0]} heads but a parameter has shape "
                             f"{tuple(p.shape)} (head axis first)")
        return v.to(device=p.device, dtype=p.dtype).reshape(-1, *([1] * (p.dim() - 1)))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError("StackedAdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                lr = float(group["lr"]) * self._broadcast(group["head_lr"], p, "lr")
                wd = self._broadcast(group["weight_decay"], p, "weight_decay")
                m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
                p.mul_(1 - lr * wd)  # decoupled weight decay
                m.lerp_(g, 1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                step_size = lr / (1 - beta1 ** t)
                denom = (v.sqrt() / math.sqrt(1 - beta2 ** t)).add_(group["eps"])
                p.sub_(step_size * m / denom)
        return loss
