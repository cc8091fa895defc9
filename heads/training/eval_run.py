"""`cli eval`: a trained head (and the frozen baseline beside it) scored on any dataset whose texts are in the
store, on the features it was trained on (`check_same_features`); writes metrics.json and the run files of the
split it scores (the outputs as train-head's, heads.training.run).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from headstore.data.files import atomic_write_json
from headstore.data.progress import progress_write
from headstore.data.outputs import prepare_output_dir
from headstore.featurize.encoder.model import pick_device
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.artefacts.task_features import TaskFeatures
from headstore.heads.evaluation.evaluate import TEST_SPLIT, evaluate_head
from headstore.heads.artefacts.judged import read_judged
from headstore.heads.kinds import (WHOLE, Task, check_scorable, kind_of, load_task, overlap_line, seen_masks, task_rows,
                                   without_overlap, without_seen)
from headstore.heads.kinds.unlabeled import unlabeled_in_store, unlabeled_report
from headstore.heads.settings.config import TrainConfig
from headstore.heads.training.lexical_fit import eval_lexical, load as load_lexical
from headstore.heads.training.memory_use import eval_memory, load_for_eval
from headstore.heads.training.run import _data_notes, check_same_features, load_head, write_runs


def eval_split(task: Task) -> str:
    """The split `cli eval` scores: test; else the whole table (no split column); else dev; else train."""
    for split in (TEST_SPLIT, WHOLE, "dev", "train"):
        if split in task.eval_sets:
            return split
    raise ValueError(f"{task.name}: nothing to evaluate (no split with judgements or pairs)")


def eval_seen(head_dir: str, config: dict, store, task: Task, split: str) -> tuple[dict, str, frozenset | None]:
    """({split: seen mask} on the documents the head's training judged (its judgements.parquet,
    heads.artefacts.judged), a note where the kind splits but the head keeps no record, those documents' store rows
    (None: no record))."""
    judged, why = read_judged(head_dir, config, store)
    if judged is not None:
        return seen_masks(task, judged, (split,)), "", judged
    if not seen_masks(task, frozenset(), (split,)):  # a kind whose figures are not split (not IR)
        return {}, "", None
    return {}, f"{why}: its figures are not split into seen and unseen queries", None


def judged_in_corpus(judged: frozenset | None, task: Task, split: str) -> int | None:
    """How many of an IR split's corpus documents are among `judged` (eval_seen's store rows, before remapping);
    None where the split is no IR split or the head keeps no record."""
    data = task.eval_sets.get(split)
    if judged is None or not hasattr(data, "doc_rows"):
        return None
    return int(np.isin(np.asarray(data.doc_rows), np.fromiter(judged, dtype=np.int64, count=len(judged))).sum())


def _items_of(task: Task, split: str, per_item: dict, seen: dict) -> dict:
    """eval_head's `items`: the per-item values, the gold, the seen mask (heads.kinds.seen), as lists."""
    gold = getattr(task.eval_sets[split], "labels", None)
    return {**{k: np.asarray(v, dtype=np.float64).tolist() for k, v in per_item.items()},
            "gold": None if gold is None else np.asarray(gold, dtype=np.float64).tolist(),
            "seen": seen[split].tolist() if split in seen else None}


def without_excluded(task: Task, exclude_overlap: str | None, store, data_path: str) -> tuple[Task, dict | None]:
    """`--exclude-overlap D`: the task without the items that use a text of D, and the count (None without D)."""
    if not exclude_overlap:
        return task, None
    task, dropped = without_overlap(task, task_rows(load_task(exclude_overlap, store, for_eval=True)))
    split = eval_split(task)
    if dropped.get(split) and not kind_of(task).n_items(task.eval_sets[split]):
        raise ValueError(f"--exclude-overlap {exclude_overlap}: every one of the {dropped[split]} "
                         f"{kind_of(task).items_name} of {data_path} split {split!r} uses a text of it, so "
                         "nothing is left to score (exclude another dataset, or leave --exclude-overlap out)")
    return task, dropped


def without_trained_unlabeled(task: Task, config: dict, store, data_path: str) -> tuple[Task, dict]:
    """An out-of-domain set (another dataset than the head's own) without the items that use one of the
    --unlabeled texts the head trained on (its config.json "unlabeled"; heads.kinds.without_seen), and the count
    ({} where the head had none, or `data_path` is its own dataset, whose scored texts training kept apart)."""
    files = config.get("unlabeled") or []
    if not files or Path(str(config.get("data", ""))).resolve() == Path(data_path).resolve():
        return task, {}
    what = f"the --unlabeled texts the head trained on ({', '.join(files)})"
    try:
        rows = unlabeled_in_store(store, files)[1]
    except (OSError, ValueError) as err:  # moved, deleted or not in this store: said, never silently skipped
        progress_write(f"warning: {what} cannot be read ({str(err).splitlines()[0]}); out-of-domain items that "
                       "use them are not dropped")
        return task, {"not_checked": str(err).splitlines()[0]}
    task, lost = without_seen(task, {what: set(rows.tolist())}, f"--data {data_path}", eval_split)
    if lost:
        progress_write(overlap_line(f"--data {data_path}", lost))
    return task, lost.get(what, {})


def eval_head(store_path: str, head_dir: str, data_path: str, out_dir: str, data_format: str | None = None,
              exclude_overlap: str | None = None, score_range=None, overwrite: bool = False,
              device: str = "auto", items: dict | None = None, unlabeled: tuple[str, ...] = (), memory="auto",
              lexical="auto") -> dict:
    """Evaluate a trained head on any dataset whose texts are in the store; write metrics.json.

    Scores the test split, or the whole table when it has no split column (`eval_split`).
    `exclude_overlap`: a dataset (e.g. the one the head was trained on) whose texts must not be scored:
    evaluation pairs / queries that use one of its texts are dropped (counted in metrics.json).
    `items`: filled with the scored split's per-item values ("baseline": cosine, "head") as lists, and
    "gold" (the gold scores / labels where the kind has them, else None): what bootstrap CIs resample; "seen":
    the items' seen mask (heads.kinds.seen; None where the figures are not split).
    `unlabeled`: --unlabeled files, the distractors a positives-only pairs table's anchors rank
    (heads.kinds.unlabeled). `memory`: auto | on | off, the head's document memory (heads.training.memory_use)."""
    inputs = (data_path, head_dir, exclude_overlap, *unlabeled)
    prepare_output_dir(out_dir, "eval", overwrite, inputs=inputs, create=False)  # refuse before the work
    device = pick_device(device)  # where the features and the head are held (auto: cuda when available)
    store = FeatureStore.open(store_path)
    model, norm, config = load_head(head_dir)
    model, norm = model.to(device), norm.to(device)
    array = config.get("array", "features")
    check_same_features(head_dir, config, store, array)
    task = load_task(data_path, store, data_format, score_range=score_range, for_eval=True, unlabeled=unlabeled)
    train_cfg = TrainConfig.from_dict(config["train"])
    check_scorable(task, train_cfg.eval_energy, head_dir)  # a classifier head scores labelled texts only
    unlabeled_note = unlabeled_report(task, None, (eval_split(task),))
    task, dropped = without_excluded(task, exclude_overlap, store, data_path)
    task, trained_dropped = without_trained_unlabeled(task, config, store, data_path)
    seen, seen_note, judged = eval_seen(head_dir, config, store, task, eval_split(task))  # store rows: not remapped
    judged_here = judged_in_corpus(judged, task, eval_split(task))
    tf = TaskFeatures.for_task(store, task, device=device)
    placed, memory_info = load_for_eval(head_dir, store, task, tf, memory)  # another store, a changed text: an error
    lexical_saved = load_lexical(head_dir, lexical)  # BM25 fused in at the head's weight (heads.training.lexical_fit)
    task, features = tf.remap(task), tf.read(array)  # only the rows the task uses (heads.artefacts.task_features)
    task = kind_of(task).for_eval(task, train_cfg)  # labelled texts: the labelled set k-NN / probe use
    energy = train_cfg.eval_energy
    split = eval_split(task)
    rankings: dict = {}
    per_item: dict = {}
    metrics = evaluate_head(task, features, model, norm, energy, (split,), dim=store.dim, rankings=rankings,
                            items=per_item, seen=seen)
    metrics.update(eval_memory(task, features, model, norm, placed, energy, split, per_item, memory_info))
    metrics.update(eval_lexical(task, features, model, norm, placed, energy, split, per_item, lexical_saved,
                                store.dim, seen, lexical, judged_here))
    if items is not None:
        items.update(_items_of(task, split, per_item[split], seen))
    if split != TEST_SPLIT:  # report the split there is under the usual keys
        only = metrics.pop(split)
        metrics.update({k: only[k] for k in ("baseline", "head", "ci", "parts") if k in only})
    metrics["split"] = split
    metrics.update(_data_notes(task), head_dir=str(head_dir), data=str(data_path), device=device,
                   **({"unlabeled": unlabeled_note} if unlabeled_note else {}),
                   **({"parts_note": seen_note} if seen_note else {}),
                   **({"overlap_dropped": {"with": str(exclude_overlap), **dropped}} if dropped is not None else {}),
                   **({"unlabeled_dropped": trained_dropped} if trained_dropped else {}))
    out = prepare_output_dir(out_dir, "eval", overwrite, inputs=inputs)
    atomic_write_json(out / "metrics.json", metrics, sort_keys=True)
    write_runs(task, features, model, norm, energy, (split,), out, rankings)
    return metrics
