"""How long a grid will take: a rough figure in the plan, then one from the first stack's measured pace.

A stack's time is modelled as its epochs x (steps x (a fixed cost per step + a cost per head parameter) + the
dev scoring of the epoch, a cost per head parameter and scored row). The step's fixed part (the loss, the
batching and the optimiser's calls, whatever the heads' size) dominates the small heads of a grid, which is
why a count of training pairs x head-epochs (the earlier estimate) was off by up to 18x: the stacks share
their steps. The constants are the STS-B grid's (examples/grid.toml, 12 stacks of 12 MiniLM heads) on a
2-core AMD EPYC (AVX2) fitted per stack; early stopping only shortens the time.

After the first stack the grid prints the other stacks' time at the pace the first one measured (its seconds
over its modelled seconds, applied to the rest): the machine, its load and the task's costs the model misses
are then in the figure.
"""
from __future__ import annotations

import math
from dataclasses import replace

from headstore.heads.settings.config import HeadConfig
from headstore.heads.network.features import array_list
from headstore.heads.kinds import Task, kind_of

# seconds on a quiet 2-core CPU (module doc); fitted on the STS-B grid's stacks, depth 1 and 2 (their ratios
# measured on a loaded machine, within 2x of each other per stack; the scale set so that the whole grid, 1.5-3
# min quiet, is modelled at ~2 min)
STEP_SECONDS = 0.017  # per training step of a stack, whatever its heads' size
STEP_PARAM_SECONDS = 3.6e-9  # per step and head parameter (a batch of 64: forward, backward, update)
EVAL_SECONDS = 7.5e-11  # per epoch, head parameter and row the dev scoring embeds


def head_params(head: HeadConfig, in_dim: int) -> int:
    """Weights and biases of one head taking `in_dim` inputs."""
    dims = replace(head, in_dim=in_dim).layer_dims()
    return sum(a * b + b for a, b in zip(dims, dims[1:]))


def stack_seconds(items: list[tuple], task: Task, store_dim: int) -> float:
    """The modelled seconds of one stack of the plan ((head id, head, train, array) items), every epoch run."""
    _, head, train, array = items[0]
    kind = kind_of(task)
    try:
        pairs = len(kind.train_set(task, train.loss))  # positives-only losses keep the genuine pairs
    except ValueError:
        pairs = len(kind.train_rows(task)) // 2
    steps = math.ceil(max(pairs, 1) / max(1, min(train.batch_size, pairs or 1)))
    dev = task.eval_sets.get("dev")
    eval_rows = len(kind.rows(dev)) if dev is not None else 0
    params = len(items) * head_params(head, store_dim * len(array_list(array)))
    per_epoch = steps * (STEP_SECONDS + STEP_PARAM_SECONDS * params) + EVAL_SECONDS * params * eval_rows
    return train.epochs * per_epoch


def plan_seconds(groups: dict, task: Task, store_dim: int) -> list[float]:
    """The modelled seconds of every stack of the plan, in training order."""
    return [stack_seconds(items, task, store_dim) for items in groups.values()]


def pace_line(measured: float, modelled: list[float], compiled: float = 0.0) -> str:
    """After the first stack: its time (`measured`, less `compiled`, the seconds it spent compiling the fused
    optimiser step once for the process), and the other stacks' at its measured pace."""
    pace = measured / max(modelled[0], 1e-9)
    rest = pace * sum(modelled[1:])
    also = f" + {compiled:.0f} s compiling, once" if compiled >= 1 else ""
    return (f"grid: the first stack took {measured:.0f} s{also} ({pace:.1f}x the plan's model): the other "
            f"{len(modelled) - 1} stack(s) about {rest / 60:.1f} min at this pace (early stopping shortens it)")
