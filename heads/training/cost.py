"""What training a stack costs, modelled: seconds per step and per dev scoring (a grid's plan, heads.experiments.
grid_estimate), and from them how often a long epoch is scored on dev (`scoring_interval`).

A step costs a fixed part (the loss, the batching and the optimiser's calls, whatever the heads' size) and a part
per head parameter (a batch of 64: forward, backward, update); a dev scoring a part per head parameter and row it
embeds. The constants are the STS-B grid's (examples/grid.toml, 12 stacks of 12 MiniLM heads) fitted per stack
on 2 cores of an AMD EPYC Zen 4 (bench/speed/grid_stsb.py), fp32; bf16 runs faster, early stopping shortens.

Scoring within an epoch: an epoch of at most LONG_EPOCH steps is scored once, at its end (every figure before
this setting keeps its numbers). A longer one (an IR set of 100 k judged pairs is 1,700 steps of 64) is scored
every N steps, N chosen so that scoring costs about DEV_SHARE of the steps between two scorings, at least
MIN_INTERVAL steps, and the epoch cut into equal parts (its end is always a scoring). Early stopping then counts
scorings: `patience` of them without a dev improvement is patience x N steps.
"""
from __future__ import annotations

import math
from dataclasses import replace

from headstore.heads.settings.config import HeadConfig

STEP_SECONDS = 0.006  # per training step of a stack, whatever its heads' size (the loss, batching, Python)
STEP_PARAM_SECONDS = 5.9e-9  # per step and head parameter (a batch of 64: forward, backward, update)
EVAL_SECONDS = 2e-11  # per dev scoring, head parameter and row the scoring embeds
# fitted 2026-11-29 on the median steps of the grid's 10 stacks (depth 1: 16 ms over the losses, depth 2: 34 ms)
# and its 9 s of dev scoring, fp32, load ~2 (before: 0.017, 3.6e-9 and 7.5e-11, the compiled / eager update)

LONG_EPOCH = 512  # steps: an epoch longer than this is scored within (32 k pairs at a batch of 64)
MIN_INTERVAL = 64  # steps between two scorings at least: a dev figure of fewer steps moves mostly by noise
DEV_SHARE = 0.1  # of the training time the in-epoch scorings may take


def head_params(head: HeadConfig, in_dim: int) -> int:
    """Weights and biases of one head taking `in_dim` inputs."""
    dims = replace(head, in_dim=in_dim).layer_dims()
    return sum(a * b + b for a, b in zip(dims, dims[1:]))


def step_seconds(params: int) -> float:
    """Modelled seconds of one training step of a stack of `params` head parameters (all heads)."""
    return STEP_SECONDS + STEP_PARAM_SECONDS * params


def scoring_seconds(params: int, dev_rows: int) -> float:
    """Modelled seconds of one dev scoring of a stack of `params` head parameters embedding `dev_rows` rows."""
    return EVAL_SECONDS * params * dev_rows


def scoring_interval(epoch_steps: int, params: int, dev_rows: int, every: int = 0) -> int:
    """Steps between two dev scorings: `every` where given (> 0; at most an epoch), else one epoch when it has at
    most LONG_EPOCH steps, else the plan's N (module doc)."""
    if every:
        return min(every, epoch_steps)
    if epoch_steps <= LONG_EPOCH:
        return epoch_steps
    wanted = scoring_seconds(params, dev_rows) / (DEV_SHARE * step_seconds(params))
    parts = max(1, epoch_steps // max(MIN_INTERVAL, math.ceil(wanted)))  # scorings per epoch
    return math.ceil(epoch_steps / parts)
