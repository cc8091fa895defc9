"""AdamW for stacked heads: a learning rate and weight decay per head.

torch.optim.AdamW takes one lr per parameter group, but a stacked parameter (H, ...) holds all H
heads in one tensor. StackedAdamW keeps lr and weight_decay as (H,) tensors and broadcasts them
over each parameter's leading head axis; the update is otherwise torch.optim.AdamW's
(decoupled weight decay, bias-corrected moments), so head h follows exactly the trajectory it would
under torch.optim.AdamW(lr=lr[h], weight_decay=weight_decay[h]) trained on its own.

Fused: with `fused=True` each parameter's update (and a per-head gradient scale, for clipping) runs as
one loop compiled by `torch.compile` instead of ~10 eager passes over p, grad and the moments: the update
of a stack of small heads is bound by memory traffic, not arithmetic, so this is 3-5x faster (measured
on a 2-core CPU; bench/speed/grid.py). The maths are the same; the compiled loop may round differently in the
last bit. Compiling costs seconds once per process (cached on disk by torch), so heads.training.train uses it
only for stacks with enough work (`fused_pays`); if compiling fails the eager update is used, with a warning.
Every parameter enters the compiled loop as an (H, N) view, so one graph serves every stack of a grid.

LR schedulers: torch schedulers need a scalar group["lr"], so the per-head rates live in
group["head_lr"] and the effective rate of head h is group["lr"] * group["head_lr"][h]. Given a
per-head lr, the constructor sets group["lr"] = 1.0 (a schedule factor) and head_lr = lr; given a
float, group["lr"] = lr and head_lr = 1. Multiplicative schedules (LambdaLR, CosineAnnealingLR,
LinearLR, ...) therefore scale every head's rate alike.
"""
from __future__ import annotations

import math
import os
import time
import warnings
from typing import Iterable, Optional, Sequence, Union

import torch

PerHead = Union[float, Sequence[float], torch.Tensor]

# parameter updates (parameters x steps) from which compiling the fused update pays for its compile time:
# eager costs ~5-10 ns per parameter update more (2 cores), compiling ~3-10 s from torch's disk cache
# (a minute when the cache is cold). Decided per stack from its own work only, never from what ran before it in
# the process: the two updates round differently, so a stack's numbers must not depend on the stacks before it
# (a grid's axis order, the Ray engine's longest-first submission)
FUSED_MIN_UPDATES = 1e9
COMPILE_ENV = "HEADSTORE_COMPILE"  # "0": never compile, "1": always, unset: by the amount of work


def fused_pays(n_params: int, steps: int) -> bool:
    """Whether a run of `steps` updates of `n_params` parameters should use the compiled update."""
    setting = os.environ.get(COMPILE_ENV, "")
    if setting in ("0", "1"):
        return setting == "1"
    return n_params * steps >= FUSED_MIN_UPDATES


def _adamw_update(p, g, m, v, grad_scale, decay, step_size, bc2_sqrt, beta1: float, beta2: float, eps: float):
    """One AdamW update of a stacked parameter in place; per-head factors are (H, 1, ...) tensors."""
    g = g * grad_scale
    p.mul_(decay)  # decoupled weight decay: 1 - lr * wd
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    denom = (v.sqrt() / bc2_sqrt).add_(eps)
    p.sub_(step_size * m / denom)


_compiled_update = None  # torch.compile(_adamw_update), built on first use; False after a failed compile
compile_seconds = 0.0  # time this process spent in calls that compiled a graph (a grid's time estimate leaves it out)
# graphs the compiled update may keep: (H, N) views make one graph serve every parameter shape; a few more
# come from sizes torch specialises (a stack of one head, a float64 or CUDA stack)
RECOMPILE_LIMIT = 32


def _compile(backend: str = "inductor"):
    return torch.compile(_adamw_update, dynamic=True, fullgraph=True, backend=backend)


def _as_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """A per-head factor (a scalar or (H, 1, ..., 1)) as a contiguous (H, 1) tensor."""
    return torch.broadcast_to(t.reshape(-1, 1), (heads, 1)).contiguous()


def _fused_update(p, g, m, v, grad_scale, decay, step_size, bc2_sqrt, beta1: float, beta2: float,
                  eps: float) -> bool:
    """Run the compiled update; False (nothing changed) when it cannot run here (the eager update then does).

    Every tensor enters as an (H, N) view (per-head factors (H, 1)), so one compiled graph serves every
    parameter shape of every stack: compiled on the stacked shapes, each new shape was a new graph, and a
    grid of a dozen stacks hit dynamo's recompile limit. Duck shaping (two sizes that happen to be equal
    taken as one symbol) is off for the same reason; the maths are unchanged (elementwise)."""
    global _compiled_update, compile_seconds
    if _compiled_update is None:
        _compiled_update = _compile()
    if _compiled_update is False or not all(t.is_contiguous() for t in (p, g, m, v)):
        return False
    H = p.shape[0]
    rows = [t.view(H, -1) for t in (p, g, m, v)]  # (H, N) views: the update writes p, m, v in place
    factors = [_as_rows(t, H) for t in (grad_scale, decay, step_size)]  # (H, 1)
    from torch.fx.experimental import _config as fx_config  # here: torch's compiler settings, this call only

    graphs, t0 = _graphs(), time.perf_counter()
    try:
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT), fx_config.patch(use_duck_shape=False):
            _compiled_update(*rows, *factors, bc2_sqrt, beta1, beta2, eps)
    except Exception as e:  # no C++ compiler, unsupported platform: compiling fails before any write
        warnings.warn(f"StackedAdamW: the fused update could not be compiled ({type(e).__name__}: {e}); "
                      "using the eager update")
        _compiled_update = False
        return False
    if _graphs() != graphs:
        compile_seconds += time.perf_counter() - t0
    return True


def _graphs() -> int:
    """Graphs dynamo compiled in this process so far."""
    from torch._dynamo.utils import counters  # here: torch's compiler bookkeeping

    return counters["stats"]["unique_graphs"]


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
                 weight_decay: PerHead = 1e-2, fused: bool = False):
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

    @torch.no_grad()
    def step(self, closure=None, *, grad_scale: Optional[torch.Tensor] = None):
        """One update. grad_scale: optional (H,) factor each head's gradient is multiplied by first (per-head
        gradient clipping folded into the update; p.grad itself is left unscaled on the fused path)."""
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
                scale = None if grad_scale is None else self._broadcast(grad_scale, p, "grad_scale")
                if self.fused and _fused_update(
                        p, g, m, v, torch.ones_like(lr) if scale is None else scale, 1 - lr * wd,
                        lr / (1 - beta1 ** t), torch.tensor(math.sqrt(1 - beta2 ** t), dtype=p.dtype, device=p.device),
                        beta1, beta2, group["eps"]):
                    continue
                if scale is not None:
                    g = g.mul_(scale)
                p.mul_(1 - lr * wd)  # decoupled weight decay
                m.lerp_(g, 1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                step_size = lr / (1 - beta1 ** t)
                denom = (v.sqrt() / math.sqrt(1 - beta2 ** t)).add_(group["eps"])
                p.sub_(step_size * m / denom)
        return loss
