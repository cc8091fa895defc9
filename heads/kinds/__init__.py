"""The task-kind registry: how each kind of dataset is trained on, evaluated and reported.

One module per kind, each owning how its task is built from a dataset and the store, its training set and
batches, its evaluator (`dict[str, float]` with prefixed names, its primary metric, its bootstrap CI), its
run files and its train-head defaults (heads.kinds.base.TaskKind):

- `ir` (heads.kinds.ir): each query ranks the whole corpus; BEIR folders and positives-only pairs tables;
- `sts` (heads.kinds.sts): graded pairs, Spearman of -E against the gold scores;
- `pairs` (heads.kinds.pairs): labelled pairs, AUC / F1 / accuracy / AP;
- `labels` (heads.kinds.labels): labelled texts, k-NN / probe / retrieval by class.

`BUILDERS` maps a dataset format (data.dataset) to the function that joins it to the store; the task it
builds names its kind. `--unlabeled` texts join any task after it is built (heads.kinds.unlabeled). Adding a
kind is one new module here plus one line in each table below.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from headstore.data.dataset import load_dataset
from headstore.data.readers import DETECT
from headstore.heads.kinds import ir, labels, pairs, sts
from headstore.heads.kinds.base import PREFIX, WHOLE, PairSet, Task, TaskKind, TrainSet  # noqa: F401
from headstore.heads.kinds.registry import KINDS, held_out_rows, kind_of  # noqa: F401  (the registry, here too)
from headstore.heads.kinds.seen import judged_documents
from headstore.heads.kinds.unlabeled import join_unlabeled
from headstore.heads.scoring.losses import CLASSES

BUILDERS = {"beir": ir.from_beir, "sts": sts.from_table, "pairs": pairs.from_table, "labels": labels.from_dataset}


def for_training(task: Task, cfg) -> Task:
    """The task `cfg` trains on: its kind's `for_training` (labelled texts: shots, hierarchy)."""
    return kind_of(task).for_training(task, cfg)


def check_scorable(task: Task, energy: str, head: str) -> None:
    """One line unless `task`'s kind can score a head evaluated under `energy`: a classifier head's class scores
    (heads.scoring.losses.CLASSES, no energy between texts) only labelled texts (TaskKind.scores_classes);
    the line names the kinds that can (issue 54 item 14: it was a KeyError deep in the evaluation)."""
    if energy == CLASSES and not kind_of(task).scores_classes:
        can = sorted(name for name, kind in KINDS.items() if kind.scores_classes)
        raise ValueError(f"{head} is a classifier head (its outputs are class scores, not an energy between texts): "
                         f"it can score {', '.join(can)} data only; {task.name} is {task.kind} data")


def primary_metric(kind: str, energy: str) -> str:
    """The name of the metric heads of a `kind` task are selected on, under `energy`."""
    return KINDS[kind].primary_metric(energy)


def kind_of_metric(metric: str) -> TaskKind:
    """The kind whose primary metric is `metric` under some energy (an eval record names its metric, not
    its kind): e.g. "manhattan_auc" -> pairs, "spearman_cosine" -> sts."""
    for kind in KINDS.values():
        if metric in {kind.primary_metric(e) for e in PREFIX}:
            return kind
    valid = sorted(k.primary_metric(e) for k in KINDS.values() for e in PREFIX)
    raise ValueError(f"{metric!r} is no task kind's primary metric; valid: {valid}")


def load_task(data_path: str, store, format: str | None = None, score_range=None, for_eval: bool = False,
              unlabeled: tuple[str, ...] = ()) -> Task:
    """Read `data_path` and join it to `store` by text_id.

    score_range: the (LO, HI) scale of an STS table's scores; None detects 0-1 or 0-5.
    for_eval: only evaluation splits are wanted (no training, no dev carving; a table without a
    dev/test split is scored whole).
    unlabeled: --unlabeled files whose texts join the task (heads.kinds.unlabeled: the corpus a positives-only
    pairs task ranks and mines, the anchor regulariser's sample)."""
    ds = load_dataset(data_path, format, score_range=score_range if score_range is not None else DETECT)
    if ds.kind not in BUILDERS:
        raise ValueError(f"{data_path}: a {ds.kind!r} dataset has no pairs to train or evaluate on "
                         "(use a BEIR folder, an STS table, a pairs table or labelled texts)")
    if unlabeled and ds.kind == "pairs":  # positive pairs will rank a shared corpus: dev carved as BEIR's
        return join_unlabeled(pairs.from_table(ds, store, for_eval, shared_corpus=True), ds, store, unlabeled)
    task = BUILDERS[ds.kind](ds, store, for_eval)
    return join_unlabeled(task, ds, store, unlabeled) if unlabeled else task


def judgement_pairs(task: Task) -> dict[str, PairSet]:
    """The training run's judgements as pairs of store rows: "train" (the pairs trained on) and "dev" (dev's
    relevant judgements, which selection saw; IR kinds: `TaskKind.relevant_pairs`), where the task has them."""
    out = {} if task.train is None or not len(task.train) else {"train": task.train}
    dev = task.eval_sets.get("dev")
    pairs = None if dev is None else kind_of(task).relevant_pairs(dev)
    if pairs is not None and len(pairs[0]):
        out["dev"] = PairSet(*pairs)
    return out


def training_judged(task: Task) -> dict[str, frozenset[int]]:
    """{"train", "dev"}: the store rows of the documents judged relevant by each part of `judgement_pairs`."""
    pairs = judgement_pairs(task)
    return {s: judged_documents([] if s not in pairs else pairs[s].positive if pairs[s].labels is None
                                else pairs[s].positive[pairs[s].labels > 0.5]) for s in ("train", "dev")}


def seen_masks(task: Task, judged: frozenset[int], splits) -> dict[str, np.ndarray]:
    """{split: seen mask} of the evaluation splits whose kind splits its figures into seen and unseen (IR), on
    the documents `judged` (store rows in the task's row space)."""
    kind = kind_of(task)
    masks = {s: kind.seen_mask(task.eval_sets[s], judged) for s in splits if s in task.eval_sets}
    return {s: m for s, m in masks.items() if m is not None}


def task_seen_masks(task: Task, splits) -> dict[str, np.ndarray]:
    """{split: seen mask} of a task's own splits (heads.kinds.seen): dev against the documents the train pairs
    judged (a dev query is never set against its own judgements); every other split against those and dev's
    (the training run saw both: it trained on the one and selected on the other)."""
    judged = training_judged(task)
    return {**seen_masks(task, judged["train"], [s for s in splits if s == "dev"]),
            **seen_masks(task, judged["train"] | judged["dev"], [s for s in splits if s != "dev"])}


def task_rows(task: Task) -> set[int]:
    """Every store row (text) a task uses: its training set and all evaluation sets."""
    kind = kind_of(task)
    parts = [kind.train_rows(task)] + [kind.rows(s) for s in task.eval_sets.values()]
    return set(np.concatenate(parts).tolist()) if parts else set()


def without_overlap(task: Task, rows: set[int], source: str = "the training dataset") -> tuple[Task, dict[str, int]]:
    """The task with every evaluation item (a pair, a query, a labelled text) that uses one of `rows` dropped.

    For out-of-domain evaluation: e.g. SemEval STS pairs whose sentences also appear in STS-B. Returns the
    filtered task and how many items were dropped per split (reported, never silent)."""
    kind = kind_of(task)
    drop = np.fromiter(rows, dtype=np.int64, count=len(rows))
    eval_sets, dropped = {}, {}
    for split, data in task.eval_sets.items():
        eval_sets[split], dropped[split] = kind.without(data, drop)
    note = ", ".join(f"{split}: {n} dropped" for split, n in dropped.items())
    dev_note = (task.dev_note + "; " if task.dev_note else "") + f"overlap with {source} removed ({note})"
    return dataclasses.replace(task, eval_sets=eval_sets, dev_note=dev_note), dropped


UNLABELED = "the --unlabeled texts"


def seen_rows(task: Task, data: str) -> dict[str, set[int]]:
    """{what: store rows} of the texts a head trained on `task` has seen (without_seen's sources): its --unlabeled
    texts (anchors, impostors, distractors, a distillation's anchors and candidates, pseudo-labels; first, so a text
    of both, e.g. an unlabeled text joined to an IR corpus, is blamed on them) and the task's own (trained on,
    selected on, in-domain; `data`: how the user named it, "--data FILE")."""
    sources = {UNLABELED: set(np.asarray(task.unlabeled.rows).tolist())} if task.unlabeled is not None else {}
    return {**sources, data: task_rows(task)}


def without_seen(ood: Task, sources: dict[str, set[int]], option: str,
                 split: Callable[[Task], str]) -> tuple[Task, dict]:
    """An out-of-domain set never scores a text the head trained on (issue 54): `ood` without every item that uses
    a row of `sources` ({what: rows}, e.g. seen_rows), and {what: {split: dropped}} (an item sharing texts with two
    sources counts once, for the first). option: how the user named the set ("--transfer FILE"); split(ood): the
    split scored, which must keep 2 items or more (else ValueError naming the option and the file)."""
    dropped, total = {}, dict.fromkeys(ood.eval_sets, 0)
    for what, rows in sources.items():
        ood, n = without_overlap(ood, rows, source=what)
        if any(n.values()):
            dropped[what] = {s: k for s, k in n.items() if k}
        total = {s: total[s] + n.get(s, 0) for s in total}
    scored, kind = split(ood), kind_of(ood)
    left = kind.n_items(ood.eval_sets[scored])
    if total.get(scored) and left < 2:
        raise ValueError(f"{option}: {total[scored]} of the {total[scored] + left} {kind.items_name} of its "
                         f"{scored!r} split share a text with {' or '.join(dropped)}, which the head trained on; "
                         f"{left} left to score (an out-of-domain set must be another dataset: give another, or "
                         "leave it out)")
    return ood, dropped


def overlap_line(option: str, dropped: dict) -> str:
    """The terminal's line on what an out-of-domain set lost: '--transfer F: dropped N (test: N) sharing a text
    with --data D; ...'."""
    parts = [f"{sum(n.values())} ({', '.join(f'{s}: {k}' for s, k in n.items())}) sharing a text with {what}"
             for what, n in dropped.items()]
    return f"{option}: dropped {'; '.join(parts)}"
