"""Learning-rate schedules: transformers' warm-up schedules as a factor per optimiser update.

`lr_lambda(schedule, warmup_steps, total_steps)` returns f(step) -> factor of the peak learning rate for
update `step` (0-based): the lambda of transformers' `get_cosine_schedule_with_warmup`,
`get_linear_schedule_with_warmup` or `get_constant_schedule_with_warmup`, its formula written out here: importing
`transformers.optimization` costs ~3 CPU-seconds (it imports peft and the generation code), which every grid and
train-head paid before its first step. The factors are bit for bit transformers' own (tests/heads/test_schedule.py
checks them against those public functions' lambdas and against digests recorded before). It is a plain
function: it can drive a `torch.optim.lr_scheduler.LambdaLR`, scale every head's own rate in StackedAdamW
(heads.training.train), or set param-group rates by hand where training resumes mid-run (adapt, finetune).

One difference from transformers' convention, kept from the schedules headstore always used: warm-up
counts the update being taken. transformers' lambda gives update s the factor s / warmup_steps (the first
update at lr 0: its Trainer steps the scheduler after the optimiser); here update s < warmup_steps gets the
lambda at s + 1, (s + 1) / warmup_steps, so warm-up ends at the peak on its last update and no update is
spent at lr 0. After warm-up the factor is transformers' lambda at s, unchanged.
"""
from __future__ import annotations

import math
from typing import Callable

SCHEDULES = ("cosine", "linear", "constant")  # the decay after warm-up (heads and `cli adapt` alike)


def _hf_lambda(schedule: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """transformers' lambda of a public schedule function (cosine: half a cycle), as transformers computes it."""
    def warmup(step: int) -> float:
        return float(step) / float(max(1, warmup_steps))

    def progress(step: int) -> float:
        return float(step - warmup_steps) / float(max(1, total_steps - warmup_steps))

    decays = {"cosine": lambda step: max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress(step)))),
              "linear": lambda step: max(0.0, float(total_steps - step) / float(max(1, total_steps - warmup_steps))),
              "constant": lambda step: 1.0}
    if schedule not in decays:
        raise ValueError(f"schedule={schedule!r}; valid: {list(SCHEDULES)}")
    decay = decays[schedule]
    return lambda step: warmup(step) if step < warmup_steps else decay(step)


def lr_lambda(schedule: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """Factor of the peak lr for update `step` (0-based) of `total_steps`: linear warm-up over
    `warmup_steps` updates, then cosine / linear decay to 0 at `total_steps`, or constant."""
    decay = _hf_lambda(schedule, warmup_steps, total_steps)
    warmup = _hf_lambda("constant", warmup_steps, total_steps)

    def factor(step: int) -> float:
        # warm-up is the same ramp in every schedule: transformers' at step + 1 (1.0 on the last warm-up update)
        return float(warmup(step + 1) if step < warmup_steps else decay(step))

    return factor
