"""The STS kind: graded pairs, Spearman (and Pearson) of -E against the gold scores, rescaled to [0, 1].

An STS table's scores are rescaled from the table's scale LO-HI (detected as 0-1 or 0-5, or given with
`--score-range`) to [0, 1], what the losses see as graded targets. Heads on graded tables take a linear
residual head at lr 1e-3 for 10 epochs (the STS-B study's choice, docs/l1-energy.md, round 2).
"""
from __future__ import annotations

import numpy as np

from headstore.heads.kinds.base import PREFIX, Task, TaskKind
from headstore.heads.kinds.tables import evaluate_pairs, pair_set, split_frames, table_splits
from headstore.heads.scoring.metrics import bootstrap_ci, sts_metrics


class STSKind(TaskKind):
    name = "sts"
    form = "graded"
    defaults = {"depth": 1, "lr": 1e-3, "epochs": 10, "anchor_weight": 0.0}  # the anchor costs STS-B and gains
    # nothing on SemEval (docs/robust.md)
    data_words = "graded"  # how config.json "defaults" names the data
    defaults_why = "the STS-B study's choice"
    suggestion = ("--graded pearson --depth 1 --lr 1e-3 (train-head's defaults for STS tables) and a layer mix "
                  "(featurize --layers -1,-2,-4; --array features+features_layer-2+features_layer-4)")
    statistic = "spearman"  # the primary metric is a rank statistic against the gold
    metric_names = ("spearman_{p}", "pearson_{p}")

    def primary_metric(self, energy: str) -> str:
        return f"spearman_{PREFIX[energy]}"

    def evaluate(self, task, split, embed, energies):
        return evaluate_pairs(task.eval_sets[split], embed, energies, _metrics, self.nan_metrics)

    def selection_scores(self, task, split, embed, energy, precision):
        """The Spearman of every head alone (what training selects on; evaluate's numbers, no Pearson)."""
        results, _ = evaluate_pairs(task.eval_sets[split], embed, (energy,), _spearman, self.nan_metrics)
        return [r[self.primary_metric(energy)] for r in results]

    def ci(self, task, split, values, n_boot=1000):
        gold = task.eval_sets[split].labels
        return list(bootstrap_ci(values, gold=gold, statistic=self.statistic, n_boot=n_boot))


def _metrics(data, e: np.ndarray, p: str) -> dict:
    m = sts_metrics(-e, data.labels)
    return {f"spearman_{p}": m["spearman"], f"pearson_{p}": m["pearson"]}


def _spearman(data, e: np.ndarray, p: str) -> dict:
    return {f"spearman_{p}": sts_metrics(-e, data.labels, pearson=False)["spearman"]}


KIND = STSKind()


def from_table(ds, store, for_eval: bool) -> Task:
    """An STS table (sentence1, sentence2, score) joined to the store."""
    frame, dev_note = table_splits(ds, for_eval)
    lo, hi = ds.score_range or (0.0, 1.0)
    train, eval_sets = None, {}
    for split, part in split_frames(frame):
        labels = ((part["score"].to_numpy() - lo) / (hi - lo)).astype(np.float32)  # heads see [0, 1]
        pairs = pair_set(store, ds, part, f"{ds.path} split {split!r}", labels)
        if split == "train" and not for_eval:
            train = pairs
        else:
            eval_sets[split] = pairs
    evaluation = f"graded pairs: Spearman of -E against the gold scores (scale {lo:g}-{hi:g}, rescaled to 0-1)"
    return Task(ds.name, KIND.name, train, eval_sets, dev_note, None, set(), evaluation, ds.score_range)
