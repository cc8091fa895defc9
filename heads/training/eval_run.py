"""`cli eval`: a trained head (and the frozen baseline beside it) scored on any dataset whose texts are in the
store, on the features it was trained on (`check_same_features`); writes metrics.json and the run files of the
split it scores (the outputs as train-head's, heads.training.run).
"""
from __future__ import annotations

import numpy as np

from headstore.data.files import atomic_write_json
from headstore.data.outputs import prepare_output_dir
from headstore.featurize.encoder.model import pick_device
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.artefacts.task_features import TaskFeatures
from headstore.heads.evaluation.evaluate import TEST_SPLIT, evaluate_head
from headstore.heads.kinds import WHOLE, Task, kind_of, load_task, task_rows, without_overlap
from headstore.heads.kinds.unlabeled import unlabeled_report
from headstore.heads.settings.config import TrainConfig
from headstore.heads.training.memory_use import eval_memory, load_for_eval
from headstore.heads.training.run import _data_notes, check_same_features, load_head, write_runs


def eval_split(task: Task) -> str:
    """The split `cli eval` scores: test; else the whole table (no split column); else dev; else train."""
    for split in (TEST_SPLIT, WHOLE, "dev", "train"):
        if split in task.eval_sets:
            return split
    raise ValueError(f"{task.name}: nothing to evaluate (no split with judgements or pairs)")


def eval_head(store_path: str, head_dir: str, data_path: str, out_dir: str, data_format: str | None = None,
              exclude_overlap: str | None = None, score_range=None, overwrite: bool = False,
              device: str = "auto", items: dict | None = None, unlabeled: tuple[str, ...] = (), memory="auto") -> dict:
    """Evaluate a trained head on any dataset whose texts are in the store; write metrics.json.

    Scores the test split, or the whole table when it has no split column (`eval_split`).
    `exclude_overlap`: a dataset (e.g. the one the head was trained on) whose texts must not be scored:
    evaluation pairs / queries that use one of its texts are dropped (counted in metrics.json).
    `items`: filled with the scored split's per-item values ("baseline": cosine, "head") as lists, and
    "gold" (the gold scores / labels where the kind has them, else None): what bootstrap CIs resample.
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
    unlabeled_note = unlabeled_report(task, None, (eval_split(task),))
    dropped = None
    if exclude_overlap:
        task, dropped = without_overlap(task, task_rows(load_task(exclude_overlap, store, for_eval=True)))
        split = eval_split(task)
        if dropped.get(split) and not kind_of(task).n_items(task.eval_sets[split]):
            raise ValueError(f"--exclude-overlap {exclude_overlap}: every one of the {dropped[split]} "
                             f"{kind_of(task).items_name} of {data_path} split {split!r} uses a text of it, so "
                             "nothing is left to score (exclude another dataset, or leave --exclude-overlap out)")
    tf = TaskFeatures.for_task(store, task, device=device)
    placed, memory_info = load_for_eval(head_dir, store, task, tf, memory)  # another store, a changed text: an error
    task, features = tf.remap(task), tf.read(array)  # only the rows the task uses (heads.artefacts.task_features)
    train_cfg = TrainConfig.from_dict(config["train"])
    task = kind_of(task).for_eval(task, train_cfg)  # labelled texts: the labelled set k-NN / probe use
    energy = train_cfg.eval_energy
    split = eval_split(task)
    rankings: dict = {}
    per_item: dict = {}
    metrics = evaluate_head(task, features, model, norm, energy, (split,), dim=store.dim, rankings=rankings,
                            items=per_item)
    metrics.update(eval_memory(task, features, model, norm, placed, energy, split, per_item, memory_info))
    if items is not None:
        gold = getattr(task.eval_sets[split], "labels", None)
        items.update({k: np.asarray(v, dtype=np.float64).tolist() for k, v in per_item[split].items()})
        items["gold"] = None if gold is None else np.asarray(gold, dtype=np.float64).tolist()
    if split != TEST_SPLIT:  # report the split there is under the usual keys
        only = metrics.pop(split)
        metrics.update({"baseline": only["baseline"], "head": only["head"], "ci": only["ci"]})
    metrics["split"] = split
    metrics.update(_data_notes(task))
    metrics["head_dir"], metrics["data"], metrics["device"] = str(head_dir), str(data_path), device
    if unlabeled_note:
        metrics["unlabeled"] = unlabeled_note
    if dropped is not None:
        metrics["overlap_dropped"] = {"with": str(exclude_overlap), **dropped}
    out = prepare_output_dir(out_dir, "eval", overwrite, inputs=inputs)
    atomic_write_json(out / "metrics.json", metrics, sort_keys=True)
    write_runs(task, features, model, norm, energy, (split,), out, rankings)
    return metrics
