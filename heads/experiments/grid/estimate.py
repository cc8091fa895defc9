"""How long a grid will take: a rough figure in the plan, then one from the first stack's measured pace.

A stack's time is modelled as its epochs x (steps x (a fixed cost per step + a cost per head parameter) + the
dev scoring of the epoch, a cost per head parameter and scored row) + the re-mining in head space, a cost per
head parameter and embedded row. Above exact_max, dev scores the candidates and re-mining the pooled documents
(heads.network.candidates), not the corpus: counting the corpus put a 1M-document grid at 18x its time.
The step's fixed part (the loss, the batching and the optimiser's calls, whatever the heads' size) dominates
the small heads of a grid, which is why a count of training pairs x head-epochs (the earlier estimate) was off
by up to 18x: the stacks share their steps. The step and scoring constants are the STS-B grid's
(heads.training.cost), re-mining's a matmul rate; early stopping only shortens the time.

After the first stack the grid prints the other stacks' time at the pace the first one measured (its seconds
over its modelled seconds, applied to the rest): the machine, its load and the task's costs the model misses
are then in the figure.
"""
from __future__ import annotations

import math

import numpy as np

from headstore.heads.network.features import array_list
from headstore.heads.kinds import Task, kind_of
from headstore.heads.scoring.losses import LOSSES
from headstore.heads.training.cost import head_params, scoring_interval, scoring_seconds, step_seconds  # noqa: F401

REMINE_SECONDS = 2.5e-11  # per head parameter and row a re-mine embeds: large blocks (up to POOL_FLOATS
# outputs) run at matmul speed, 2 FLOPs at ~80 GFLOP/s (2 quiet AVX2 cores; 40 measured at load 2.5)


def train_anchors(task: Task, train) -> np.ndarray:
    """(P,) anchor store rows of the pairs `train` trains on (positives-only losses keep the genuine pairs)."""
    kind = kind_of(task)
    try:
        return np.asarray(kind.train_set(task, train.loss).anchor)
    except ValueError:
        rows = kind.train_rows(task)
        return rows[:len(rows) // 2]


def remine_rows(task: Task, train, anchors: np.ndarray) -> int:
    """Rows re-mining in head space embeds over the whole training: each re-mine (every remine_every epochs
    after the first) embeds the unique anchors and their pooled documents (at most pool_k each: pools overlap),
    the whole corpus at or below exact_max (heads.training.batches.NegativeSource)."""
    if not (train.remine and train.mined_k and LOSSES[train.loss].negatives and task.corpus_rows is not None):
        return 0
    n_docs, n_anchors = len(np.unique(task.corpus_rows)), len(np.unique(anchors))
    pooled = min(n_docs, n_anchors * max(train.pool_k, train.mined_k))
    docs = pooled if train.negatives.on_candidates(n_docs) else n_docs
    return (train.epochs - 1) // train.remine_every * (n_anchors + docs)


def stack_seconds(items: list[tuple], task: Task, store_dim: int) -> float:
    """The modelled seconds of one stack of the plan ((head id, head, train, array) items), every epoch run."""
    _, head, train, array = items[0]
    anchors = train_anchors(task, train)
    steps = math.ceil(max(len(anchors), 1) / max(1, min(train.batch_size, len(anchors) or 1)))
    dev_rows = kind_of(task).selection_rows(task, "dev", train.negatives) if "dev" in task.eval_sets else 0
    params = len(items) * head_params(head, store_dim * len(array_list(array)))
    per_epoch = steps * step_seconds(params) + scoring_seconds(params, dev_rows) * scorings_per_epoch(
        steps, params, dev_rows, train.eval_every)
    return train.epochs * per_epoch + REMINE_SECONDS * params * remine_rows(task, train, anchors)


def scorings_per_epoch(steps: int, params: int, dev_rows: int, every: int) -> int:
    """Dev scorings of one epoch of `steps` steps (heads.training.cost.scoring_interval)."""
    return math.ceil(steps / scoring_interval(steps, params, dev_rows, every))


def plan_seconds(groups: dict, task: Task, store_dim: int) -> list[float]:
    """The modelled seconds of every stack of the plan, in training order."""
    return [stack_seconds(items, task, store_dim) for items in groups.values()]


def pace_line(measured: float, modelled: list[float]) -> str:
    """After the first stack: its time (`measured`), and the other stacks' at its measured pace."""
    pace = measured / max(modelled[0], 1e-9)
    rest = pace * sum(modelled[1:])
    return (f"grid: the first stack took {measured:.0f} s ({pace:.1f}x the plan's model): the other "
            f"{len(modelled) - 1} stack(s) about {rest / 60:.1f} min at this pace (early stopping shortens it)")
