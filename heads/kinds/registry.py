"""The task-kind registry (`KINDS`: one line a kind) and what reads it without the rest of heads.kinds: a task's
kind (`kind_of`) and the rows its dev and test items score (`held_out_rows`). heads.kinds re-exports them; the
modules it imports (heads.kinds.unlabeled) take them from here, so no import goes back up to the package."""
from __future__ import annotations

import numpy as np

from headstore.heads.kinds import ir, labels, pairs, sts
from headstore.heads.kinds.base import Task, TaskKind

KINDS: dict[str, TaskKind] = {k.name: k for k in (ir.KIND, sts.KIND, pairs.KIND, labels.KIND)}


def kind_of(task: Task) -> TaskKind:
    return KINDS[task.kind]


def held_out_rows(task: Task) -> np.ndarray:
    """Store rows of the texts the dev and test items score (TaskKind.item_rows of every evaluation set): never
    trained on, never an anchor."""
    kind = kind_of(task)
    return np.unique(np.concatenate([np.zeros(0, np.int64), *(kind.item_rows(s) for s in task.eval_sets.values())]))
