"""What every task kind shares: a dataset joined to the store (`Task`), pairs as store rows, dev carving,
and the `TaskKind` interface each kind module implements (heads.kinds registers them).

The encoder is never in the loop: every text a task needs must already be in the store (`cli featurize`),
and a task only ever holds integer row numbers into the store's feature matrix.

Splits: train on `train`, select on `dev`, report `test` once. A dataset without a dev split gets a held-out
slice of its train items (`DEV_FRACTION`, drawn with `DEV_SEED`) carved *by text* (`carve_dev`). For
evaluation only (`for_eval=True`: `cli eval`, grid transfer, out-of-domain selection), a table with no split
other than train is scored whole, as split `all`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from headstore.heads.scoring.losses import GENUINE_THRESHOLD, LOSSES, applicable
from headstore.heads.scoring.metrics import bootstrap_ci

DEV_FRACTION = 0.1  # a tenth of train queries/pairs: enough for a stable dev metric on SciFact (~80 queries)
DEV_SEED = 20260  # fixed so every head, seed and run sees the same dev slice
WHOLE = "all"  # the split name of a table scored whole (no split column, evaluation only)
PREFIX = {"l1": "manhattan", "l2": "euclidean", "cosine": "cosine",  # metric-name prefix of each energy,
          "classes": "classifier"}  # and of a classifier head's own class scores (heads.scoring.losses.CLASSES)

Embed = Callable[..., torch.Tensor]  # (store rows (n,), role "query" | "document") -> (H, n, d) head outputs;
# a kind embeds what it ranks or compares in the roles its texts take (IR: queries and documents; a pair: its
# first text as the query, its second as the document), which only a query-side head tells apart


@dataclass(frozen=True)
class PairSet:
    """Pairs as store rows. `labels` is None for positive pairs (all relevant)."""

    anchor: np.ndarray  # (P,) int64 store rows
    positive: np.ndarray  # (P,) int64
    labels: np.ndarray | None = None  # (P,) float32: 1/0 for labelled pairs, score rescaled to [0, 1] for STS
    negative: np.ndarray | None = None  # (P, K) int64 given negatives

    def __len__(self) -> int:
        return len(self.anchor)

    def subset(self, keep: np.ndarray) -> "PairSet":
        return PairSet(self.anchor[keep], self.positive[keep], None if self.labels is None else self.labels[keep],
                       None if self.negative is None else self.negative[keep])


@dataclass(frozen=True)
class TrainSet:
    """What a stack trains on: anchor and positive rows, their targets in the form a loss takes, given
    negatives. targets: None (positive pairs), (P,) labels / scores in [0, 1], or (P, L) label codes."""

    anchor: np.ndarray  # (P,) int64 store rows
    positive: np.ndarray  # (P,) int64
    targets: np.ndarray | None
    negative: np.ndarray | None  # (P, K) int64 given negatives
    form: str  # heads.scoring.losses.FORMS: positives | binary | graded | classes

    def __len__(self) -> int:
        return len(self.anchor)


@dataclass(frozen=True)
class Task:
    """A dataset joined to a store. `kind` names its TaskKind (heads.kinds.KINDS): how it is evaluated."""

    name: str
    kind: str
    train: PairSet | None
    eval_sets: dict[str, object]  # split -> the kind's evaluation set (IRSplit, PairSet, LabelSplit)
    dev_note: str = ""
    corpus_rows: np.ndarray | None = None  # IR: every document row (for mining negatives)
    relevant: set[tuple[int, int]] = field(default_factory=set)  # (anchor row, positive row) known relevant
    evaluation: str = ""  # how the evaluation splits are scored, in words
    score_range: tuple[float, float] | None = None  # sts: the scale the gold scores were rescaled from
    unlabeled: object | None = None  # --unlabeled texts joined (heads.kinds.unlabeled.Unlabeled): rows and report


def store_rows(store, texts: list[str], where: str, role: str = "document") -> np.ndarray:
    """Store rows of `texts` in `role` (encoded under the store's prompt of that role), or ValueError naming
    `where` when a text was never featurized in it."""
    try:
        return store.rows_for(store.row_ids(texts, role))
    except KeyError as e:
        raise ValueError(
            f"{where}: a text is not in the feature store ({e.args[0] if e.args else e}) "
            f"{' as a ' + role if any(store.prompts.values()) else ''} (run `cli featurize` on this dataset "
            "first, with the same --pair-roles)") from None


def text_groups(items: list[list[str]]) -> list[np.ndarray]:
    """Groups of item indices connected by a shared text (directly or through other items), each sorted,
    in the order of their first item: the connected components of the item-text graph (scipy)."""
    index: dict[str, int] = {}
    item_of, text_of = [], []
    for i, texts in enumerate(items):
        for t in texts:
            item_of.append(i)
            text_of.append(index.setdefault(t, len(index)))
    n, m = len(items), len(index)
    graph = coo_matrix((np.ones(len(item_of)), (item_of, np.asarray(text_of, dtype=np.int64) + n)),
                       shape=(n + m, n + m))
    _, labels = connected_components(graph, directed=False)
    item_labels = labels[:n]
    _, first = np.unique(item_labels, return_index=True)
    return [np.flatnonzero(item_labels == item_labels[i]) for i in np.sort(first)]


def carve_dev(items: list[list[str]], unit: str = "pairs", seed: int = DEV_SEED) -> tuple[np.ndarray, np.ndarray, str]:
    """Hold out about DEV_FRACTION of the train items (pairs or queries) as dev, by text.

    items[i]: the texts item i uses. Items sharing a text (directly or through others) form a group, and
    whole groups are drawn (in a fixed random order) until the dev share is reached, so no dev text
    appears in a train item and nothing is dropped. When one group holds almost everything (a graph that
    will not split), dev is drawn item by item instead and the train items sharing a text with dev are
    dropped and counted. Returns (is_dev (n,) bool, dropped (n,) bool, a note for metrics.json)."""
    n = len(items)
    if n < 2:
        raise ValueError(f"only {n} train {unit}: too few to hold out a dev set (add a dev split)")
    target = max(1, int(round(DEV_FRACTION * n)))
    rng = np.random.default_rng(seed)
    groups = text_groups(items)
    is_dev = np.zeros(n, dtype=bool)
    taken = 0
    for g in rng.permutation(len(groups)):
        if taken + len(groups[g]) <= target:
            is_dev[groups[g]] = True
            taken += len(groups[g])
        if taken >= target:
            break
    dropped = np.zeros(n, dtype=bool)
    how = f"{len(groups)} groups of items sharing a text"
    if taken < max(1, target // 2):  # no split into groups of the right size: draw items, drop the overlap
        is_dev[:] = False
        is_dev[rng.permutation(n)[:target]] = True
        dev_texts = {t for i in np.flatnonzero(is_dev) for t in items[i]}
        dropped = ~is_dev & np.array([any(t in dev_texts for t in texts) for texts in items])
        how = f"drawn one by one; {int(dropped.sum())} train {unit} sharing a text with dev were dropped"
        if dropped.sum() + is_dev.sum() >= n:
            raise ValueError(f"the train {unit} share texts so much that no dev set can be held out without "
                             "emptying train (add a dev split)")
    note = (f"dev = {int(is_dev.sum())} of {n} train {unit} held out by text ({DEV_FRACTION:.0%}, seed {seed}; "
            f"{how}): no dev text appears in a train pair")
    return is_dev, dropped, note


class TaskKind:
    """How one kind of task is trained on, evaluated and reported. Subclasses (one module per kind) fill in
    the evaluation; the defaults here are those of kinds that train on pairs with no special sampler."""

    name = ""
    form = "positives"  # the data form its training set has for the losses (heads.scoring.losses.FORMS)
    defaults: dict = {}  # train-head's defaults for the settings left unset (heads.settings.config.KIND_DEPENDENT)
    data_words = ""  # how config.json "defaults" names data of this kind ("graded", "labelled")
    defaults_why = "the defaults (the SciFact study's choice)"  # where `defaults` come from, for config.json
    suggestion = ""  # what to try when a head loses to the frozen features on dev
    metric_names: tuple[str, ...] = ()  # metric names, "{p}" standing for the energy's prefix
    items_name = "pairs"  # what an evaluation set's items are, in words (queries, pairs, texts)
    scores_classes = False  # whether it evaluates a classifier head's class scores (CLASSES): labelled texts
    statistic = "mean"  # the bootstrap statistic of the primary metric from its per-item values
    # (heads.scoring.metrics: "mean" of per-query / per-text values, or "spearman" / "auc" against the gold)

    def defaults_for(self, loss: str, shots: int = 0, unlabeled: bool = False, hierarchy: bool = False) -> dict:
        """train-head's defaults for the settings left unset when `loss` trains on all of train (shots = 0) or
        on n texts per class (labelled texts: the classifier head has its own, few-shot ones too, self-trained
        where `unlabeled` texts exist); here the kind's `defaults` whatever the loss."""
        return self.defaults

    # --- metrics ---------------------------------------------------------------------------------
    def primary_metric(self, energy: str) -> str:
        raise NotImplementedError

    def summary_metrics(self) -> tuple[str, ...]:
        """The metrics a grid's seed summary reports (those present in its rows): the primary metric under
        each energy."""
        return tuple(self.primary_metric(e) for e in PREFIX)

    def nan_metrics(self, energies: tuple[str, ...]) -> dict[str, float]:
        """Every metric NaN (a head whose outputs are not finite has nothing worth scoring)."""
        return {n.format(p=PREFIX[e]): float("nan") for e in energies for n in self.metric_names}

    def evaluate(self, task: Task, split: str, embed: Embed, energies: tuple[str, ...]) -> tuple[list[dict], list[dict]]:
        """(metrics per head, per-item values per head keyed by energy prefix) on one split."""
        raise NotImplementedError

    def evaluate_splits(self, task: Task, splits: tuple[str, ...], embed: Embed, energies: tuple[str, ...],
                        rankings: Optional[dict] = None) -> dict[str, tuple[list[dict], list[dict]]]:
        """{split: evaluate()} of several splits; a kind whose splits rank the same items (IR: one corpus) ranks
        them in one pass and may keep in `rankings` what its run files and candidate share need."""
        return {split: self.evaluate(task, split, embed, energies) for split in splits}

    def selection_scores(self, task: Task, split: str, embed: Embed, energy: str, precision: str) -> list[float]:
        """The primary metric of every head on `split`, once per epoch (what training selects on)."""
        results, _ = self.evaluate(task, split, embed, (energy,))
        return [r[self.primary_metric(energy)] for r in results]

    def suggest(self, task: Task, head_cfg, cfg) -> str:
        """What to try when a head trained under (head_cfg, cfg) loses to the frozen features on dev: settings to
        change (the IR kind leaves out those the head already had); here the kind's `suggestion`."""
        return self.suggestion

    def ci(self, task: Task, split: str, values: np.ndarray, n_boot: int = 1000) -> list[float]:
        """Bootstrap 95% CI of the primary metric from its per-item values (default: their mean)."""
        return list(bootstrap_ci(values, n_boot=n_boot))

    def n_items(self, data) -> int:
        """How many items (queries, pairs, texts) an evaluation set scores."""
        return len(data)

    def warnings(self, task: Task, split: str) -> list[str]:
        """What a reader of `split`'s figures must be told (IR: no query has a relevant document); none here."""
        return []

    def seen_mask(self, data, judged: frozenset[int]) -> np.ndarray | None:
        """(n_items,) bool, aligned with the per-item values: the items on documents the training judged
        (heads.kinds.seen, store rows `judged`); None where a kind has no documents to have seen (only IR figures
        are split)."""
        return None

    def relevant_pairs(self, data) -> tuple[np.ndarray, np.ndarray] | None:
        """(query rows, document rows) of an evaluation set's relevant judgements (IR); None for other kinds."""
        return None

    def selection_set(self, task: Task, split: str, X: torch.Tensor, negatives) -> tuple[object, dict]:
        """(the evaluation set training selects on each epoch, how it was made): the split itself here (IR on a
        corpus above negatives.exact_max: candidates, heads.kinds.ir). `negatives`: the training settings'
        NegativesConfig section (exact_max, pool_k)."""
        return task.eval_sets[split], {"method": "exact"}

    def selection_rows(self, task: Task, split: str, negatives) -> int:
        """How many store rows each epoch's scoring of selection_set embeds, without making it (a plan's cost)."""
        return len(self.rows(task.eval_sets[split]))

    def candidate_share(self, task: Task, split: str, chosen, rankings: dict) -> dict:
        """How well a selection set made of candidates stands for the whole split (IR: the share of the exact
        top-10 inside the candidates, from the rankings `evaluate_splits` kept); nothing to say here."""
        return {}

    def as_reported(self, data):
        """An evaluation set prepared to be reported in full (labelled texts: dev is k-NN only per epoch)."""
        return data

    def grid_columns(self, task: Task) -> dict:
        """Columns a grid adds to each row of a stack trained on `task` (labelled texts: how many)."""
        return {}

    def write_runs(self, task: Task, embed: Embed, energy: str, splits, out_dir, run_name: str,
                   rankings: Optional[dict] = None) -> list:
        """Run files of the head's rankings (IR: TREC runs, from `rankings` kept by evaluate_splits where
        given); none for other kinds."""
        return []

    # --- data ------------------------------------------------------------------------------------
    def rows(self, data) -> np.ndarray:
        """Every store row an evaluation set uses."""
        return np.concatenate([data.anchor, data.positive])

    def item_rows(self, data) -> np.ndarray:
        """The store rows of an evaluation set's own items, never trained on (IR: its queries, not the corpus
        every split shares)."""
        return self.rows(data)

    def without(self, data, rows: np.ndarray):
        """(the evaluation set without the items that use one of `rows`, number dropped)."""
        keep = ~(np.isin(data.anchor, rows) | np.isin(data.positive, rows))
        return data.subset(keep), int((~keep).sum())

    def train_rows(self, task: Task) -> np.ndarray:
        """Every store row the training set uses."""
        if task.train is None:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([task.train.anchor, task.train.positive])

    def train_form(self, task: Task) -> str:
        """The form of the task's training data for the losses (heads.scoring.losses.FORMS)."""
        return self.form if task.train is not None and task.train.labels is not None else "positives"

    def train_set(self, task: Task, loss: str) -> TrainSet:
        """The training pairs `loss` trains on: a loss that needs labels refuses positives-only data; a
        positives-only loss on labelled or graded data keeps the genuine pairs (label >= GENUINE_THRESHOLD)."""
        train = task.train
        if train is None or len(train) == 0:
            raise ValueError(f"{task.name}: no training pairs (no train split)")
        form = self.train_form(task)
        reason = applicable(loss, form, task.name, task.kind)
        if reason:
            raise ValueError(reason)
        if train.labels is None or form in LOSSES[loss].accepts:
            return TrainSet(train.anchor, train.positive, train.labels, train.negative, form)
        keep = train.labels >= GENUINE_THRESHOLD
        if not keep.any():
            raise ValueError(f"{task.name}: loss {loss!r} trains on positive pairs, and no train pair has a label "
                             f">= {GENUINE_THRESHOLD} (of 1; STS: score at the top fifth of its range) (check "
                             "--score-range, or use a loss that takes graded labels: l1-energy, contrastive, cosent)")
        pairs = train.subset(keep)
        return TrainSet(pairs.anchor, pairs.positive, None, pairs.negative, "positives")

    def for_training(self, task: Task, cfg) -> Task:
        """The task `cfg` trains on (labelled texts: shots, hierarchy); unchanged for pair kinds."""
        if cfg.shots or cfg.hierarchy:
            raise ValueError(f"{task.name}: shots / hierarchy apply to labelled texts (--format labels), "
                             f"not to a {task.kind!r} dataset")
        return task

    def for_eval(self, task: Task, cfg) -> Task:
        """The task a head trained under `cfg` is evaluated on (labelled texts: its labelled reference set)."""
        return task

    def sampler(self, task: Task):
        """None (an epoch is a permutation of the training pairs), or a function
        (configs, generators, batch size, steps) -> (H, steps, b) indices into the training set."""
        return None
