"""Learning-rate schedules: transformers' warm-up schedules as a factor per optimiser update.

`lr_lambda(schedule, warmup_steps, total_steps)` returns f(step) -> factor of the peak learning rate for
update `step` (0-based), the lambda of transformers' `get_cosine_schedule_with_warmup`,
`get_linear_schedule_with_warmup` or `get_constant_schedule_with_warmup` (taken from the LambdaLR those
public functions return; no private transformers helper). It is a plain function: it can
drive a `torch.optim.lr_scheduler.LambdaLR`, scale every head's own rate in StackedAdamW (heads.training.train), or
set param-group rates by hand where training resumes mid-run (adapt, finetune).

One difference from transformers' convention, kept from the schedules headstore always used: warm-up
counts the update being taken. transformers' lambda gives update s the factor s / warmup_steps (the first
update at lr 0: its Trainer steps the scheduler after the optimiser); here update s < warmup_steps gets the
lambda at s + 1, (s + 1) / warmup_steps, so warm-up ends at the peak on its last update and no update is
spent at lr 0. After warm-up the factor is transformers' lambda at s, unchanged.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable

SCHEDULES = ("cosine", "linear", "constant")  # the decay after warm-up (heads and `cli adapt` alike)


@lru_cache(maxsize=64)
def _hf_lambda(schedule: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """transformers' own lambda of a public schedule function: built on a throwaway optimiser (a LambdaLR
    keeps its lambda in `lr_lambdas`); cached, since callers ask per update."""
    import torch
    import transformers  # here: importing transformers costs seconds at every CLI start

    makers = {"cosine": transformers.get_cosine_schedule_with_warmup,
              "linear": transformers.get_linear_schedule_with_warmup,
              "constant": transformers.get_constant_schedule_with_warmup}
    if schedule not in makers:
        raise ValueError(f"schedule={schedule!r}; valid: {list(SCHEDULES)}")
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    kwargs = {} if schedule == "constant" else {"num_training_steps": total_steps}  # cosine: half a cycle
    return makers[schedule](optimizer, num_warmup_steps=warmup_steps, **kwargs).lr_lambdas[0]


def lr_lambda(schedule: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """Factor of the peak lr for update `step` (0-based) of `total_steps`: linear warm-up over
    `warmup_steps` updates, then cosine / linear decay to 0 at `total_steps`, or constant."""
    decay = _hf_lambda(schedule, warmup_steps, total_steps)
    warmup = _hf_lambda("constant", warmup_steps, total_steps)

    def factor(step: int) -> float:
        # warm-up is the same ramp in every schedule: transformers' at step + 1 (1.0 on the last warm-up update)
        return float(warmup(step + 1) if step < warmup_steps else decay(step))

    return factor
