"""An anchor on the unlabeled store (`--anchor-weight`, `--anchor-data`; issue 20, lever 2).

The store holds the unlabeled corpus the seeds' setting has beside a few relevant pairs. The anchor adds
`lambda * mean_x ||f(x) - x||_1` to every head's loss, over store rows that are not training texts,
ANCHOR_ROWS rows drawn per step and head from the head's own generator (seeded apart from the batch
order, so a head with lambda = 0 trains exactly as without the option): the head moves only where the
task needs it (Search-Adaptor, Yoon et al. 2024, keeps a recovery loss of this kind). x is the head's
input (the normalised features; for a head mixing several arrays, its mixed input), so the penalty is
zero at the identity head and pulls a head toward it.

The rows (`anchor_pool`): only texts the user may train on, never a text a dev or test item scores, and never
another dataset that happens to share the store (a head does not depend on its store's other contents):
`--anchor-data D` names a dataset whose texts are in the store (its corpus, queries, sentences); unset, the task's
`--unlabeled` texts where it has them (heads.kinds.unlabeled), else its own corpus (a BEIR folder's documents; a
positives-only pairs table's is its train positives, trained on: none left). Texts of the training pairs and the
dev and test items' texts (queries, sentences) are left out and counted, so the anchor never pulls on a text the
loss trains, nor on one that is scored. Where none is left, train-head's default leaves the anchor off (said in the
defaults note); an --anchor-weight the user gives is refused in one line naming --unlabeled and --anchor-data.
metrics.json "anchor" says where the sample came from and how many rows it holds.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from headstore.heads.kinds import held_out_rows, kind_of
from headstore.heads.network.model import StackedMLP

ANCHOR_ROWS = 128  # rows per step and head: 2 batches' anchors, a fifth of a mined step's rows
ANCHOR_SEED = 0xA7C4  # offsets each head's anchor generator from its batch-order generator
ANCHOR_SAMPLE = 2  # the rule that makes the sample (a grid head's id holds it): 2, the task's own trainable texts


@dataclass(frozen=True)
class AnchorPool:
    """The rows the anchor draws from (store rows or task positions, as the task it was made of) and what
    metrics.json "anchor" says of them."""

    rows: np.ndarray  # (n,) int64, sorted unique
    report: dict

    def mapped(self, fn) -> "AnchorPool":
        """The same pool with its rows passed through `fn` (store rows -> task positions)."""
        return AnchorPool(np.asarray(fn(self.rows), dtype=np.int64), self.report)


def own_texts(task) -> tuple[np.ndarray, str]:
    """(rows, what they are) of the texts of `task` the anchor may draw from, unset --anchor-data (module doc)."""
    if task.unlabeled is not None:
        return np.asarray(task.unlabeled.rows, dtype=np.int64), "the --unlabeled texts"
    if task.corpus_rows is not None:
        return np.asarray(task.corpus_rows, dtype=np.int64), "the task's corpus documents"
    return np.zeros(0, np.int64), "none (no --unlabeled texts, no corpus)"


def anchor_pool(task, rows: np.ndarray, source: str) -> AnchorPool:
    """`rows` without the training texts and the texts the dev and test items score (rows of `task`'s space)."""
    rows = np.unique(np.asarray(rows, dtype=np.int64))
    trained = np.isin(rows, kind_of(task).train_rows(task))
    scored = np.isin(rows, held_out_rows(task)) & ~trained
    pool = rows[~trained & ~scored]
    return AnchorPool(pool, {"from": source, "rows": int(len(pool)), "training_texts_left_out": int(trained.sum()),
                             "dev_test_texts_left_out": int(scored.sum()), "rule": ANCHOR_SAMPLE})


def anchor_rows_of(store, task, weight: float, anchor_data: str = "") -> Optional[AnchorPool]:
    """The anchor's pool in store rows (`task`: in store rows) for --anchor-weight `weight` on --anchor-data
    `anchor_data` (empty: the task's own texts), None when the anchor is off; ValueError where it holds no text."""
    if not weight:
        return None
    if not anchor_data:
        pool = anchor_pool(task, *own_texts(task))
    else:
        from headstore.heads.kinds import load_task, task_rows  # the dataset readers, only when named

        named = load_task(anchor_data, store, for_eval=True)
        corpus = named.corpus_rows if named.corpus_rows is not None else []  # an IR corpus: every document
        rows = np.fromiter(task_rows(named) | {int(r) for r in corpus}, dtype=np.int64)
        if not len(rows):
            raise ValueError(f"--anchor-data {anchor_data}: none of its texts is in {store.path} (featurize it)")
        pool = anchor_pool(task, rows, f"--anchor-data {anchor_data}")
    check_pool(pool, weight)
    return pool


def check_pool(pool: AnchorPool, weight: float) -> None:
    """ValueError where the pool holds no row: the anchor would have nothing to pull on."""
    if len(pool.rows):
        return
    r = pool.report
    raise ValueError(f"--anchor-weight {weight:g}: no text to anchor on ({r['from']}: "
                     f"{r['training_texts_left_out']} training texts and {r['dev_test_texts_left_out']} dev or test "
                     "texts left out, none other); give unlabeled texts (--unlabeled FILE, or --anchor-data DATASET) "
                     "or use --anchor-weight 0")


class AnchorSampler:
    """ANCHOR_ROWS anchor rows per step and head: (H, m) rows of the pool from each head's own generator."""

    def __init__(self, pool: AnchorPool, weight: float, seeds: Sequence[int]):
        check_pool(pool, weight)
        self.pool, self.report = torch.as_tensor(pool.rows), {**pool.report, "weight": weight}
        self.gens = [torch.Generator().manual_seed(seed + ANCHOR_SEED) for seed in seeds]
        self.m = min(ANCHOR_ROWS, len(pool.rows))
        self.report["drawn_per_step"] = self.m

    def keep_heads(self, keep: list[int]) -> None:
        """Go on with the heads at positions `keep` only (heads.training.train.StackTraining.compact)."""
        self.gens = [self.gens[j] for j in keep]

    def sample(self) -> torch.Tensor:
        return torch.stack([self.pool[torch.randint(len(self.pool), (self.m,), generator=g)] for g in self.gens])


def anchor_penalty(model: StackedMLP, x: torch.Tensor) -> torch.Tensor:
    """(H,) mean over rows of ||f(x) - x||_1 for per-head inputs x (H, m, D * mix)."""
    if model.cfg.mix > 1 and not model.scalar_mix:
        raise ValueError(f"--anchor-weight keeps a head near its input; one reading {model.cfg.mix} arrays side by side "
                         "(--mix-mode concat) has no one input to stay near: use --anchor-weight 0")
    base = model.mixed_input(x) if model.scalar_mix else x
    z = model(x).float()
    if z.shape != base.shape:
        raise ValueError(f"--anchor-weight needs a head whose output has the input's width ({base.shape[-1]}); "
                         f"this one outputs {z.shape[-1]} (use out-dim = the feature dim)")
    return (z - base.float()).abs().sum(-1).mean(-1)
