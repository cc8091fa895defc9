"""A grid's inputs, read once before any stack trains: the store, the task, the out-of-domain sets and the
features of the rows they use.

`load_inputs` reads the dataset (and its --unlabeled texts), the --transfer sets without any item that shares a
text with it (counted), the rows every configuration's anchor draws from, and only the store rows all of these
use (heads.artefacts.task_features: memory set by the task, not by the store); the task's rows are then rewritten
as positions of that matrix. `ids` holds what every head id is keyed by besides its settings
(heads.experiments.grid.spec.head_id).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from headstore.data.keys import content_digest, contents, recipe
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.artefacts.task_features import TaskFeatures, rows_of, rows_of_datasets
from headstore.heads.experiments.grid.spec import split_settings
from headstore.heads.kinds import (WHOLE, PairSet, Task, judgement_pairs, load_task, overlap_line, seen_rows,
                                   without_seen)
from headstore.heads.kinds.unlabeled import grid_report
from headstore.heads.network.features import array_list
from headstore.heads.training.anchor import AnchorPool, anchor_rows_of
from headstore.heads.training.selection import OodSelection, load_selection


@dataclass
class GridInputs:
    store: FeatureStore
    task: Task  # its rows rewritten as positions of tf's matrix
    ood: dict[str, Task]  # the --transfer sets, by name (positions too)
    tf: TaskFeatures
    selection: OodSelection
    ids: dict  # the head id's keys besides its settings
    made_of: str  # every dataset file the heads read, by contents, and the train-head recipe: a row's `made_of`
    anchors: dict[str, AnchorPool]  # each anchor_data's pool ("": the task's own texts), at positions
    unlabeled_note: dict  # the roles they play (heads.kinds.unlabeled.grid_report)
    transfer_dropped: dict  # per --transfer set, its items whose text the heads trained on (baseline.json)
    judged: dict[str, PairSet]  # the training judgements in store rows (heads.kinds.judgement_pairs), kept by the grid


def load_inputs(combos: list[dict], store_path: str, data_path: str, grid_path: str, data_format: str | None,
                transfer: tuple[str, ...], select_ood: tuple[str, ...], ood_delta: float, score_range,
                unlabeled: tuple[str, ...], device) -> GridInputs:
    """Everything a grid's stacks read, the features on `device`."""
    store = FeatureStore.open(store_path)
    _check_arrays(combos, store, grid_path, store_path)
    task = load_task(data_path, store, data_format, score_range=score_range, unlabeled=unlabeled)
    unlabeled_note = grid_report(task, [split_settings(c)[1] for c in combos])  # the roles they play
    ood, dropped = _transfer_sets(task, store, transfer, f"--data {data_path}")
    anchors = _anchor_pools(combos, store, task)  # before anything trains: a pool with no text is an error now
    judged = judgement_pairs(task)  # in store rows, before the remap below
    tf = TaskFeatures.for_task(store, task, rows_of_datasets(store, select_ood), *[rows_of(t) for t in ood.values()],
                               *[p.rows for p in anchors.values()], device=device)
    task, ood = tf.remap(task), tf.remap(ood)  # rows -> positions of the rows read (heads.artefacts.task_features)
    selection = load_selection(store, select_ood, task, tf.read("features")[:, :store.dim], ood_delta,
                               remap=tf.remap, data=f"--data {data_path}")
    ids = {"data": content_digest(data_path, "--data"), "fingerprint": store.fingerprint,  # contents, never a path "transfer": tuple(ood), "in_dim": store.dim,
           "score_range": task.score_range, "select_ood": tuple(selection.sets), "ood_delta": ood_delta,
           "data_format": data_format,
           "unlabeled": unlabeled_note.get("digest")}
    anchors = {name: pool.mapped(tf.positions) for name, pool in anchors.items()}
    return GridInputs(store, task, ood, tf, selection, ids, made_of(data_path, transfer, select_ood, unlabeled, combos),
                      anchors, unlabeled_note, dropped, judged)


def made_of(data_path: str, transfer: tuple, select_ood: tuple, unlabeled: tuple, combos: list[dict]) -> str:
    """What a grid's heads were made of beside their settings (data/keys.py; a head id names the dataset by its
    path): the contents of --data, --transfer, --select-ood, --unlabeled and every anchor_data file of the grid, and
    the train-head recipe version. A row made of anything else is never resumed (heads.artefacts.files.resume_rows)."""
    anchors = sorted({c["anchor_data"] for c in combos if c.get("anchor_data")})
    parts = [content_digest(data_path, "--data"), contents(transfer, "--transfer"),
             contents(select_ood, "--select-ood"), contents(unlabeled, "--unlabeled"), contents(anchors, "anchor_data"), recipe("train-head")]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def _anchor_pools(combos: list[dict], store: FeatureStore, task: Task) -> dict[str, AnchorPool]:
    """The anchor's pool (store rows) of every anchor_data of the configurations with an anchor."""
    paths = {c.get("anchor_data", "") for c in combos if c.get("anchor_weight")}
    weight = max((c["anchor_weight"] for c in combos if c.get("anchor_weight")), default=1.0)
    return {p: anchor_rows_of(store, task, weight, p) for p in sorted(paths)}


def _check_arrays(combos: list[dict], store: FeatureStore, grid_path: str, store_path: str) -> None:
    missing = sorted({a for c in combos for a in array_list(c.get("array", "features"))} - set(store.arrays))
    if missing:
        raise ValueError(f"{grid_path}: array {missing} not in {store_path}; its arrays: {store.arrays}")


def _transfer_sets(task: Task, store: FeatureStore, paths: tuple[str, ...], data: str) -> tuple[dict, dict]:
    """The out-of-domain sets by name, without any item sharing a text with the in-domain dataset or its
    --unlabeled texts (heads.kinds.without_seen), and what each lost (counted, on the terminal too)."""
    ood, dropped, seen = {}, {}, seen_rows(task, data)
    for path in paths:  # an out-of-domain set never scores texts the head was trained or selected on
        t, lost = without_seen(load_task(path, store, for_eval=True), seen, f"--transfer {path}", transfer_split)
        ood[t.name] = t
        if lost:
            print(overlap_line(f"--transfer {path}", lost))
            dropped[t.name] = lost
    return ood, dropped


def transfer_split(task: Task) -> str:
    """The split an out-of-domain dataset is scored on: test, else the whole table, else its first split."""
    return next((s for s in ("test", WHOLE) if s in task.eval_sets), next(iter(task.eval_sets)))
