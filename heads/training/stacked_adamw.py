"""AdamW for stacked heads: a learning rate and weight decay per head.

torch.optim.AdamW takes one lr per parameter group, but a stacked parameter (H, ...) holds all H
heads in one tensor. StackedAdamW keeps lr and weight_decay as (H,) tensors and broadcasts them
over each parameter's leading head axis; the update is otherwise torch.optim.AdamW's
(decoupled weight decay, bias-corrected moments), so head h follows exactly the trajectory it would
under torch.optim.AdamW(lr=lr[h], weight_decay=weight_decay[h]) trained on its own.

Fused (the default): each head's update runs in torch's own fused AdamW kernel (the one behind
`torch.optim.AdamW(fused=True)`, on CPU and CUDA) over its slices of every parameter (views: a parameter's head axis
is first, so p[h] is contiguous), with that head's lr, weight decay and gradient scale (per-head clipping); heads
sharing all three are updated in one call (`_groups`). A stack of small heads is bound by the update's memory traffic, not arithmetic: the kernel
reads p, grad and the moments once and writes p and the moments once, against ~10 eager passes (measured 10x
fewer CPU seconds per update on a 4.7 M-parameter stack, bench/speed/grid_stsb.py). Nothing is compiled: the
kernel ships with torch (an earlier `torch.compile`d loop cost a grid 3-20 s before its first step). Heads not in
`heads` (stopped or failed: their rate is 0 for good) are skipped. Each head's numbers are the same whichever
other heads share its stack. Where the kernel is missing (a device or dtype torch has none for) the eager update
runs, with a warning; the two round differently in the last bits only.

LR schedulers: torch schedulers need a scalar group["lr"], so the per-head rates live in
group["head_lr"] and the effective rate of head h is group["lr"] * group["head_lr"][h]. Given a
per-head lr, the constructor sets group["lr"] = 1.0 (a schedule factor) and head_lr = lr; given a
float, group["lr"] = lr and head_lr = 1. Multiplicative schedules (LambdaLR, CosineAnnealingLR,
LinearLR, ...) therefore scale every head's rate alike.
"""
from __future__ import annotations

import math
import warnings
from typing import Iterable, Optional, Sequence, Union

import torch

PerHead = Union[float, Sequence[float], torch.Tensor]

_fused_ok = True  # False after torch's fused kernel failed once in this process (the eager update then runs)


def _per_head(value: PerHead, name: str) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.float64).detach().clone()
    if t.dim() > 1 or bool((t < 0).any()):
        raise ValueError(f"StackedAdamW {name} must be a float or a 1-D sequence of per-head values >= 0; got {value}")
    return t


def _fused_heads(params: list[torch.Tensor], states: list[dict], lr: torch.Tensor, wd: torch.Tensor,
                 scale: Optional[torch.Tensor], heads: list[int], betas: tuple[float, float], eps: float) -> bool:
    """The fused AdamW update of `heads` on every parameter (lr, wd, scale (H,) float64); False (nothing changed)
    where torch has no fused kernel for them."""
    global _fused_ok
    if not _fused_ok:
        return False
    steps = [s["step_t"] for s in states]  # () float32 each: the kernel reads the step, never increments it
    inv = None if scale is None else (1.0 / scale).float().to(params[0].device)  # (H,) the kernel divides by it
    done = 0
    try:
        for runs in _groups(heads, lr, wd, inv):  # heads sharing every setting of the update: one call
            a = runs[0][0]
            torch._fused_adamw_([p[a:b] for a, b in runs for p in params], [p.grad[a:b] for a, b in runs for p in params],
                                [s["exp_avg"][a:b] for a, b in runs for s in states],
                                [s["exp_avg_sq"][a:b] for a, b in runs for s in states], [], steps * len(runs),
                                lr=float(lr[a]), beta1=betas[0], beta2=betas[1], weight_decay=float(wd[a]), eps=eps,
                                amsgrad=False, maximize=False, grad_scale=None if inv is None else inv[a], found_inf=None)
            done += 1
    except (RuntimeError, NotImplementedError, AttributeError) as e:  # no kernel for this device or dtype
        if done:
            raise  # heads already updated: falling back would update them twice
        warnings.warn(f"StackedAdamW: torch's fused AdamW kernel cannot run here ({type(e).__name__}: {e}); "
                      "using the eager update")
        _fused_ok = False
        return False
    return True


def _groups(heads: list[int], lr: torch.Tensor, wd: torch.Tensor,
            inv: Optional[torch.Tensor]) -> list[list[tuple[int, int]]]:
    """The heads to update, grouped by their lr, weight decay and gradient scale (one kernel call each), a group as
    runs [a, b) of consecutive heads (one contiguous slice p[a:b] each: the kernel reads a tensor as contiguous). The
    update is elementwise, so each head gets the numbers of a call of its own, in fewer calls."""
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for h in heads:
        runs = groups.setdefault((float(lr[h]), float(wd[h]), None if inv is None else float(inv[h])), [])
        if runs and runs[-1][1] == h:
            runs[-1] = (runs[-1][0], h + 1)
        else:
            runs.append((h, h + 1))
    return list(groups.values())


class StackedAdamW(torch.optim.Optimizer):
    """AdamW whose `lr` and `weight_decay` may be (H,) tensors, one value per head.

    Every parameter must have the head axis first (shape (H, ...)). A float applies to all heads.
    Parameter groups work as in torch (e.g. a group with weight_decay=0 for biases)."""

    # torch.optim.Optimizer marks these two as never to be compiled, and that marker imports torch._dynamo on its
    # first call: 1.1-1.2 s of a 45 s grid on a 2-core Zen 4 (docs/results/heads.md). Nothing here is compiled, so
    # the functions it wraps run (torch's own, unchanged).
    add_param_group = getattr(torch.optim.Optimizer.add_param_group, "__wrapped__", torch.optim.Optimizer.add_param_group)
    zero_grad = getattr(torch.optim.Optimizer.zero_grad, "__wrapped__", torch.optim.Optimizer.zero_grad)

    def __init__(self, params: Iterable, lr: PerHead = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: PerHead = 1e-2, fused: bool = True):
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0 or eps < 0:
            raise ValueError(f"StackedAdamW: need 0 <= betas < 1 and eps >= 0; got betas={betas}, eps={eps}")
        head_lr = _per_head(lr, "lr")
        base_lr = 1.0 if head_lr.dim() == 1 else float(head_lr)
        defaults = dict(lr=base_lr, head_lr=head_lr / base_lr if base_lr else head_lr, betas=betas, eps=eps,
                        weight_decay=_per_head(weight_decay, "weight_decay"))
        super().__init__(params, defaults)
        self.fused = fused

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

    def select_heads(self, heads: Sequence[int], params: list[torch.Tensor]) -> "StackedAdamW":
        """A StackedAdamW over `params` (each holding the rows `heads` of this one's parameters, in order, one group)
        that goes on where this one is for those heads: their rates, weight decays, moments and step count."""
        if len(self.param_groups) != 1:
            raise ValueError("StackedAdamW.select_heads takes an optimizer of one parameter group")
        group, idx = self.param_groups[0], torch.as_tensor(list(heads), dtype=torch.long)
        H = group["params"][0].shape[0]
        lr = float(group["lr"]) * torch.broadcast_to(torch.as_tensor(group["head_lr"], dtype=torch.float64), (H,))
        wd = torch.broadcast_to(torch.as_tensor(group["weight_decay"], dtype=torch.float64), (H,))
        out = StackedAdamW(params, lr=lr[idx].tolist(), betas=group["betas"], eps=group["eps"],
                           weight_decay=wd[idx].tolist(), fused=self.fused)
        for p_old, p_new in zip(group["params"], params):
            state = self.state.get(p_old)
            if state:  # its moments' rows, the shared step count
                rows = idx.to(p_old.device)
                out.state[p_new] = {"step": state["step"], "step_t": state["step_t"].clone(),
                                    "exp_avg": state["exp_avg"].index_select(0, rows),
                                    "exp_avg_sq": state["exp_avg_sq"].index_select(0, rows)}
        return out

    def _state(self, p: torch.Tensor) -> dict:
        """p's moments and step count, made on its first update."""
        state = self.state[p]
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p),
                         step_t=torch.zeros((), device=p.device))
        state["step"] += 1
        state["step_t"].fill_(state["step"])
        return state

    @torch.no_grad()
    def step(self, closure=None, *, grad_scale: Optional[torch.Tensor] = None, heads: Optional[torch.Tensor] = None):
        """One update. grad_scale: optional (H,) factor each head's gradient is multiplied by first (per-head
        gradient clipping folded into the update). heads: optional (H,) bool, the heads to update (the others'
        rate is 0 for good: stopped or failed); None updates all."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if any(p.grad.is_sparse for p in params):
                raise ValueError("StackedAdamW does not support sparse gradients")
            states = [self._state(p) for p in params]
            if not params:
                continue
            H = params[0].shape[0]
            for p in params:
                self._broadcast(group["head_lr"], p, "lr")  # checks the head count
            lr = float(group["lr"]) * torch.broadcast_to(torch.as_tensor(group["head_lr"], dtype=torch.float64), (H,))
            wd = torch.broadcast_to(torch.as_tensor(group["weight_decay"], dtype=torch.float64), (H,))
            scale = None if grad_scale is None else torch.broadcast_to(grad_scale.detach().double().cpu(), (H,))
            which = list(range(H)) if heads is None else torch.nonzero(heads.cpu()).flatten().tolist()
            if self.fused and _fused_heads(params, states, lr, wd, scale, which, group["betas"], group["eps"]):
                continue
            for p, state in zip(params, states):
                self._eager(p, state, group, scale)
        return loss

    def _eager(self, p: torch.Tensor, state: dict, group: dict, scale: Optional[torch.Tensor]) -> None:
        """torch.optim.AdamW's update of every head of p, in eager passes."""
        beta1, beta2 = group["betas"]
        t = state["step"]
        lr = float(group["lr"]) * self._broadcast(group["head_lr"], p, "lr")
        wd = self._broadcast(group["weight_decay"], p, "weight_decay")
        m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
        if scale is not None:
            g = g.mul_(self._broadcast(scale, p, "grad_scale"))
        p.mul_(1 - lr * wd)  # decoupled weight decay
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        step_size = lr / (1 - beta1 ** t)
        denom = (v.sqrt() / math.sqrt(1 - beta2 ** t)).add_(group["eps"])
        p.sub_(step_size * m / denom)
