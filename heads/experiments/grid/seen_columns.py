"""The grid leaderboard's seen / unseen columns (heads.kinds.seen): each configuration's primary metric, mean over
its seeds, on the dev and test queries a relevant document of which the training judged (seen) and on the others
(unseen), from the per-query values every results row keeps (`dev_items`, `test_items`). A selection rule is
judged on what generalises by its unseen dev column; the frozen baseline rows get the same columns.
"""
from __future__ import annotations

import json

import numpy as np
import polars as pl

from headstore.heads.kinds import Task, task_seen_masks
from headstore.heads.kinds.seen import PARTS, split_counts

SPLITS = ("dev", "test")


def part_masks(task: Task) -> dict[str, np.ndarray]:
    """{split: seen mask} of the task's dev and test (IR tasks; heads.kinds.task_seen_masks)."""
    return task_seen_masks(task, SPLITS)


def _means(items: list[np.ndarray], mask: np.ndarray) -> dict[str, float | None]:
    """{part: mean over seeds of the mean over the part's queries} (None: an empty part)."""
    out = {}
    for part, keep in zip(PARTS, (mask, ~mask)):
        out[part] = float(np.mean([v[keep].mean() for v in items])) if keep.any() else None
    return out


def group_columns(group: pl.DataFrame, masks: dict[str, np.ndarray]) -> dict:
    """`{split}_seen`, `{split}_unseen` of one configuration's rows (its seeds), where every row kept the items."""
    out = {}
    for split, mask in masks.items():
        col = f"{split}_items"
        if col in group.columns and group[col].null_count() == 0:
            items = [np.asarray(json.loads(x), dtype=np.float64) for x in group[col]]
            if all(len(v) == len(mask) for v in items):
                out.update({f"{split}_{part}": v for part, v in _means(items, mask).items()})
    return out


def baseline_columns(block: dict, prefix: str, masks: dict[str, np.ndarray]) -> dict:
    """The same columns of a frozen baseline (`block`: baseline.json's, its items under the energy `prefix`)."""
    out = {}
    for split, mask in masks.items():
        items = block.get(split, {}).get("items", {}).get(prefix)
        if items is not None and len(items) == len(mask):
            out.update({f"{split}_{part}": v for part, v in _means([np.asarray(items)], mask).items()})
    return out


def headers(masks: dict[str, np.ndarray]) -> list[tuple[str, str]]:
    """(column, header) of each seen / unseen column, the header with its query count."""
    return [(f"{split}_{part}", f"{split} {part} ({split_counts(mask)[part]})") for split, mask in masks.items()
            for part in PARTS]


def legend(columns: dict) -> str:
    """The leaderboard's sentence on the columns ("" without them)."""
    if not columns:
        return ""
    return (" Seen / unseen columns: the primary metric (mean over seeds) on the queries with a relevant document "
            "judged in training (seen) and on the others (unseen); count in brackets. Unseen dev judges a selection "
            "on what generalises.")
