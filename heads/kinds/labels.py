"""The labels kind: labelled texts joined to the feature store (`LabelTask`), their batches and evaluation.

Classes are the leaf labels seen in train. Each text carries a *label code* `y` (a row of Y) such that
`Y Yᵀ` is the similarity of two texts' labels:
- flat: `y` = one-hot of the class, so `Y Yᵀ` is 1 for the same class, 0 otherwise;
- hierarchical (`hierarchy=True`): one one-hot block per level (level k = the path's first k parts;
  a label shallower than the tree repeats its leaf below itself), each scaled by 1/sqrt(D) for a tree
  of depth D, so `y_a · y_b` = (depth of the shared prefix) / D: 1 for the same label, 2/3 for
  `comp.sys.mac.hardware` ~ `comp.sys.ibm.pc.hardware` under `--label-columns level1,level2,label`.

Training set (`LabelsKind.train_set`): the texts themselves with their label codes (the class losses
compare every text of a batch with every other). `for_training(task, cfg)` builds the task a config trains on:
- `shots = 0`: every train text except the dev slice (the dataset's `dev` split, else a stratified
  `DEV_FRACTION` of train drawn with `DEV_SEED`); heads are selected on dev (k-NN accuracy);
- `shots = n`: n texts per class drawn from every train text (the dev slice included: few-shot has no dev)
  with the head's `seed` (SetFit's / MTEB's protocol: the seed draws the sample); every epoch is trained
  and the last one kept; k-NN, probe and retrieval use only the n-per-class texts as the labelled set.
  The other train texts stay in the task (`pool`): a self-trained classifier head reads them unlabeled
  (heads.training.linear_fit); their labels are never trained on.

Batches (`sample_batches`): P classes x K texts. Each batch draws P = batch_size // K distinct classes
uniformly (all classes when there are fewer) and K texts of each from a per-class queue that is
reshuffled when used up (a class with fewer than K texts repeats some; repeats are masked as `same`).
Every anchor thus has K - 1 same-class partners and (P - 1) K impostors; an epoch has
ceil(texts / batch_size) batches.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl

from headstore.data.labels import LabelSpec, detect_label_sep, unseen_labels
from headstore.heads.kinds.base import DEV_FRACTION, DEV_SEED, PREFIX, TaskKind, TrainSet, store_rows
from headstore.heads.kinds.label_eval import evaluate_labels, probe_choices
from headstore.heads.kinds.label_shots import (  # noqa: F401  (few_shot_epochs: importable from here too)
    SELF_TRAIN_ROUNDS, SELF_TRAIN_SHOTS, few_shot_epochs, few_shot_indices, shots_clipped, shots_note,
    stratified_dev)
from headstore.heads.kinds.label_task import LabelSplit, LabelTask, LabelTrainSet  # noqa: F401  (importable here)
from headstore.heads.scoring.losses import CLASSES, LOSSES


# ---- building -----------------------------------------------------------------------------------


def from_dataset(ds, store, for_eval: bool = False) -> LabelTask:
    """A labelled-text dataset (`data.labels`) joined to `store`: full data, flat labels (for_training
    rebuilds it for other settings)."""
    frame = ds.frame
    train = frame.filter(pl.col("split") == "train")
    if train.height == 0:
        raise ValueError(f"{ds.path}: no train split (splits: {', '.join(ds.splits())}); a classifier needs "
                         "labelled train texts")
    class_names = tuple(sorted(set(train["label"].to_list())))
    if len(class_names) < 2:
        raise ValueError(f"{ds.path}: the train split has a single class ({class_names[0]!r})")
    paths = {label: tuple(path) for label, path in zip(frame["label"].to_list(), frame["label_path"].to_list())}
    depth = max(len(paths[c]) for c in class_names)

    def node(path: tuple[str, ...], k: int) -> tuple[str, ...]:  # level k (0-based); leaves repeat below themselves
        return path[:k + 1] if k < len(path) else path + ("",) * (k + 1 - len(path))

    node_keys = [sorted({node(paths[c], k) for c in class_names}) for k in range(depth)]
    node_index = [{key: i for i, key in enumerate(keys)} for keys in node_keys]
    leaf_nodes = np.array([[node_index[k][node(paths[c], k)] for k in range(depth)] for c in class_names],
                          dtype=np.int64).reshape(len(class_names), depth)
    class_index = {c: i for i, c in enumerate(class_names)}

    def split_of(f: pl.DataFrame, where: str, full: bool = True) -> LabelSplit:
        classes = np.array([class_index.get(label, -1) for label in f["label"].to_list()], dtype=np.int64)
        nodes = np.full((f.height, depth), -1, dtype=np.int64)
        for i, path in enumerate(f["label_path"].to_list()):  # unseen labels: their known ancestors still count
            for k in range(depth):
                nodes[i, k] = node_index[k].get(node(tuple(path), k), -1)
        return LabelSplit(store_rows(store, f["text"].to_list(), where), classes, nodes, full)

    pool = split_of(train, f"{ds.path} split 'train'")
    splits = sorted(s for s in set(frame["split"].to_list()) if s != "train")
    eval_sets: dict[str, object] = {s: split_of(frame.filter(pl.col("split") == s), f"{ds.path} split {s!r}")
                                    for s in splits}
    every_train = pool
    if "dev" in eval_sets:
        eval_sets["dev"] = replace(eval_sets["dev"], full=False)
        dev_note = "the dataset's dev split"
    else:
        dev = stratified_dev(pool.classes)
        if dev.any():
            eval_sets["dev"] = replace(pool.subset(np.flatnonzero(dev)), full=False)
            pool = pool.subset(np.flatnonzero(~dev))
        dev_note = (f"dev = {int(dev.sum())} train texts held out ({DEV_FRACTION:.0%} of each class, "
                    f"seed {DEV_SEED})" if dev.any() else "no dev: no class has two train texts to hold one out "
                    "(the last epoch is kept)")
    level_names = _level_names(ds, depth)
    report = _report(ds, frame, class_names)
    task = LabelTask(ds.name, KIND.name, None, eval_sets, dev_note, None, set(), class_names=class_names,
                     level_names=level_names,
                     node_names=tuple(tuple(" > ".join(p for p in key if p) for key in keys) for keys in node_keys),
                     leaf_nodes=leaf_nodes, pool=pool, reference=pool, report=report, every_train=every_train,
                     coarse_of=_coarse_of(class_names, leaf_nodes))
    return _with_training_set(task, pool, hierarchy=False)


def _coarse_of(class_names: tuple[str, ...], leaf_nodes: np.ndarray) -> np.ndarray | None:
    """(C,) each class's top-level node: the tree's first level, or for flat labels that look hierarchical
    (data.labels.detect_label_sep) the part before the separator; None for flat labels without one."""
    if leaf_nodes.shape[1] > 1:
        return leaf_nodes[:, 0].copy()
    sep = detect_label_sep(class_names)
    if sep is None:
        return None
    tops = [name.split(sep)[0].strip() for name in class_names]
    index = {top: i for i, top in enumerate(sorted(set(tops)))}
    return np.array([index[t] for t in tops], dtype=np.int64)


def _level_names(ds, depth: int) -> tuple[str, ...]:
    spec = ds.spec if isinstance(getattr(ds, "spec", None), LabelSpec) else None
    if spec is not None and spec.label_columns:
        return tuple(spec.label_columns)
    return ("label",) if depth == 1 else tuple(f"level{k + 1}" for k in range(depth))


def _report(ds, frame: pl.DataFrame, class_names) -> dict:
    unseen = unseen_labels(frame)
    texts = frame.group_by("text").agg(pl.col("label").n_unique().alias("labels"),
                                       pl.col("split").n_unique().alias("splits"), pl.len().alias("n"))
    return {"n_classes": len(class_names), "skipped_empty_texts": ds.skipped,
            "unseen_labels": {s: {"n_texts": sum(c.values()), "labels": c} for s, c in unseen.items()},
            "duplicate_texts": int(texts.filter(pl.col("n") > 1).height),
            "texts_with_several_labels": int(texts.filter(pl.col("labels") > 1).height),
            "texts_in_several_splits": int(texts.filter(pl.col("splits") > 1).height),
            "texts_per_split": dict(frame.group_by("split").len().sort("split").iter_rows())}


def _with_training_set(task: LabelTask, labelled: LabelSplit, hierarchy: bool, **changes) -> LabelTask:
    return replace(task, reference=labelled, hierarchy=hierarchy, **changes)


def with_every_train_text(task: LabelTask, why: str) -> LabelTask:
    """The task whose pool and labelled set are every train text: a dev slice carved out of train goes back
    into training and leaves the evaluation sets (a few-shot head draws its shots from all of them, issue 54
    item 11; a head that needs no dev is refit on all of them). A dataset's own dev split stays. `why`: said
    in the dev note ("" keeps the note)."""
    if task.every_train is None or len(task.every_train) == len(task.pool):
        return task
    note = f"{why}: every train text trained on, the dev slice included" if why else task.dev_note
    return replace(task, pool=task.every_train, reference=task.every_train, dev_note=note,
                   eval_sets={s: v for s, v in task.eval_sets.items() if s != "dev"})


def classifier_width(task: LabelTask) -> int:
    """How many outputs a classifier head (loss ce) on `task` ends in: one per class, or with --hierarchy one
    per node of every level of the label tree (one softmax per level, heads.scoring.losses.ce)."""
    return sum(task.code_groups(True)) if task.hierarchy else len(task.class_names)


def label_space(task) -> dict:
    """What a head's config.json keeps of a labelled task, so a classifier head names its classes outside
    headstore (Head.predict, the exported model): {"labels": classes, levels, nodes per level, each class's
    node per level}; {} for other tasks."""
    if not isinstance(task, LabelTask):
        return {}
    return {"labels": {"classes": list(task.class_names), "levels": list(task.level_names),
                       "nodes": [list(names) for names in task.node_names],
                       "leaf_nodes": task.leaf_nodes.tolist()}}


# metrics a grid's seed summary reports (those present: per-level and retrieval ones join when computed)
SUMMARY_METRICS = ("probe_accuracy", "probe_macro_f1", "classifier_accuracy", "manhattan_knn_accuracy", "cosine_knn_accuracy",
                   "euclidean_knn_accuracy", "manhattan_ndcg@10", "cosine_ndcg@10", "manhattan_map", "cosine_map")


class LabelsKind(TaskKind):
    name = "labels"
    form = "classes"
    defaults = {"depth": 2, "lr": 1e-3, "epochs": 10, "anchor_weight": 0.0, "loss": "ce"}  # ce: the classifier head
    # beats the tuned probe where no energy head does (docs/labels.md, bench/labels_heads.py); the rest: the
    # energy heads' few-shot dev choice (bench/labels_fewshot_dev.py)
    classifier_defaults = {"hidden": 1024, "lr": 3e-3}  # a ce head's own: 20 Newsgroups dev accuracy 0.884 vs
    # 0.865 at 512 / 1e-3 (2 seeds; hidden 2048 or 20 epochs the same, docs/labels.md)
    few_shot_classifier_defaults = {"depth": 1, "normalize": "l2", "solver": "lbfgs"}  # --shots n: a linear
    # softmax on unit-norm features fitted to its optimum (C by CV on the shots: the tuned probe's fit), and up to
    # SELF_TRAIN_SHOTS shots self-trained over the train texts the shots leave out (docs/labels.md "Self-training")
    data_words = "labelled"  # how config.json "defaults" names the data
    defaults_why = "the 20 Newsgroups dev choice"
    suggestions = (("loss", "ce", "--loss ce (a classifier head)"), ("depth", 1, "--depth 1 --lr 1e-3"),
                   ("normalize", "l2", "--normalize l2"))  # what the guard may suggest: options of labelled
    # texts only (issue 54 item 15: --graded applies to graded pairs), each unless the head already has it

    items_name = "texts"
    scores_classes = True  # a classifier head's argmax is scored against the labels (label_eval)

    def defaults_for(self, loss: str, shots: int = 0, unlabeled: bool = False, hierarchy: bool = False) -> dict:
        """The kind's defaults, and a classifier head's own where it trains (`classifier_defaults`; with n texts
        per class (--shots n), the few-shot ones, self-trained up to SELF_TRAIN_SHOTS where
        `unlabeled` texts exist: the train texts --shots leaves out, or --unlabeled texts). With --hierarchy
        (one softmax per level, which lbfgs does not fit) the few-shot head is the linear one trained by AdamW."""
        if LOSSES[loss].outputs != "classes":
            return self.defaults
        if not shots:
            return {**self.defaults, **self.classifier_defaults}
        few = {"epochs": few_shot_epochs(shots), **self.few_shot_classifier_defaults,
               "self_train": SELF_TRAIN_ROUNDS if unlabeled and shots <= SELF_TRAIN_SHOTS else 0}
        if hierarchy:
            few = {k: v for k, v in few.items() if k not in ("solver", "self_train")}
        return {**self.defaults, **self.classifier_defaults, **few}

    def suggest(self, task, head_cfg, cfg) -> str:
        """The `suggestions` whose setting differs from the head's (the classifier head's own otherwise)."""
        have = {"loss": cfg.loss, "depth": head_cfg.depth, "normalize": cfg.normalize}
        return ", ".join(text for key, value, text in self.suggestions if have[key] != value) or "--loss supcon-kl"

    def primary_metric(self, energy: str) -> str:
        """k-NN accuracy under the head's energy; a classifier head's (CLASSES): the accuracy of its argmax."""
        return f"{PREFIX[energy]}_accuracy" if energy == CLASSES else f"{PREFIX[energy]}_knn_accuracy"

    def summary_metrics(self) -> tuple[str, ...]:
        return SUMMARY_METRICS

    def as_reported(self, data: LabelSplit) -> LabelSplit:
        return replace(data, full=True)

    def grid_columns(self, task: LabelTask) -> dict:
        return {"n_labelled": len(task.reference)}

    def train_form(self, task: LabelTask) -> str:
        return self.form

    def evaluate(self, task, split, embed, energies):
        return evaluate_labels(task, split, embed, energies)

    def evaluate_splits(self, task, splits, embed, energies, rankings=None):
        """Every split, the tuned probe chosen and fitted once for all of them (heads.kinds.label_probe)."""
        full = any(task.eval_sets[s].full for s in splits)
        probes = probe_choices(task, embed) if full else None
        return {split: evaluate_labels(task, split, embed, energies, probes) for split in splits}

    def rows(self, data: LabelSplit) -> np.ndarray:
        return data.rows

    def without(self, data: LabelSplit, rows: np.ndarray):
        keep = ~np.isin(data.rows, rows)
        return data.subset(np.flatnonzero(keep)), int((~keep).sum())

    def train_rows(self, task: LabelTask) -> np.ndarray:
        return task.reference.rows

    def train_set(self, task: LabelTask, loss: str) -> TrainSet:
        """The labelled texts themselves (anchor = positive) with their label codes (module doc)."""
        ref = task.reference
        return LabelTrainSet(ref.rows, ref.rows, task.codes(ref, task.hierarchy), None, self.form,
                             task.code_groups(task.hierarchy))

    def sampler(self, task: LabelTask):
        return task.sample_batches

    def for_training(self, task: LabelTask, cfg) -> LabelTask:
        """The task `cfg` trains on (module doc)."""
        if cfg.hierarchy and not task.hierarchical:
            raise ValueError(f"{task.name}: --hierarchy needs hierarchical labels: give --label-sep (e.g. '.') "
                             "or --label-columns (e.g. level1,level2,label)")
        if cfg.per_class < 2:
            raise ValueError(f"per_class must be >= 2 (a class needs partners in a batch), got {cfg.per_class}")
        if not cfg.shots:
            return _with_training_set(task, task.pool, cfg.hierarchy, shots=0, seed=0, per_class=cfg.per_class)
        task = with_every_train_text(task, "")  # few-shot has no dev: shots drawn from every train text
        shots = task.pool.subset(few_shot_indices(task.pool.classes, cfg.shots, cfg.seed))
        eval_sets = {s: v for s, v in task.eval_sets.items() if s != "dev"}
        clipped = shots_clipped(task, cfg.shots)
        note = (f"few-shot: {cfg.shots} texts per class drawn with seed {cfg.seed} ({len(shots)} texts); "
                "no dev split, the last epoch is kept" + (f"; {shots_note(cfg.shots, clipped)}" if clipped else ""))
        report = {**task.report, "shots_clipped": clipped} if clipped else task.report
        return _with_training_set(task, shots, cfg.hierarchy, shots=cfg.shots, seed=cfg.seed, report=report,
                                  per_class=cfg.per_class, eval_sets=eval_sets, dev_note=note)

    def for_eval(self, task: LabelTask, cfg) -> LabelTask:
        """The labelled set k-NN and the probe use: every train text, or the head's shots (flat labels)."""
        return self.for_training(task, cfg.replace(hierarchy=False))


KIND = LabelsKind()
