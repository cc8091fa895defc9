"""An anchor on the unlabeled store (`--anchor-weight`, `--anchor-data`; issue 20, lever 2).

The store holds the unlabeled corpus the seeds' setting has beside a few relevant pairs. The anchor adds
`lambda * mean_x ||f(x) - x||_1` to every head's loss, over store rows that are not training texts,
ANCHOR_ROWS rows drawn per step and head from the head's own generator (seeded apart from the batch
order, so a head with lambda = 0 trains exactly as without the option): the head moves only where the
task needs it (Search-Adaptor, Yoon et al. 2024, keeps a recovery loss of this kind). x is the head's
input (the normalised features; for a head mixing several arrays, its mixed input), so the penalty is
zero at the identity head and pulls a head toward it.

The rows: `--anchor-data D` names a dataset whose texts are in the store (its corpus, queries, sentences);
unset, the task's `--unlabeled` texts where it has them (heads.kinds.unlabeled), else every row of the store
(of a store above ANCHOR_POOL rows, a fixed sample of that many). Only
those rows' features are read beside the task's (heads.artefacts.task_features), so memory stays bounded. Texts of the training pairs are left out, so the anchor never pulls on a text
the loss trains.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from headstore.heads.settings.config import TrainConfig
from headstore.heads.network.model import StackedMLP

ANCHOR_ROWS = 128  # rows per step and head: 2 batches' anchors, a fifth of a mined step's rows
ANCHOR_SEED = 0xA7C4  # offsets each head's anchor generator from its batch-order generator
# the whole store as the anchor: up to this many rows (a fixed seeded sample of a larger store), so the
# features read for training stay bounded (heads.artefacts.task_features reads only the rows it is given): 100k rows of
# 384-d float32 are 154 MB, and a step draws 128 of them
ANCHOR_POOL = 100_000
ANCHOR_POOL_SEED = 20_2611


def anchor_rows_of(store, cfg: TrainConfig, unlabeled: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
    """The store rows `--anchor-data` names; unset, the task's unlabeled rows (`unlabeled`: store rows of its
    --unlabeled texts) where given, else the whole store: None (every row) up to ANCHOR_POOL rows, else a fixed
    seeded sample of ANCHOR_POOL of them. None too when the anchor is off."""
    if not cfg.anchor_weight:
        return None
    if not cfg.anchor_data and unlabeled is not None:
        return np.asarray(unlabeled, dtype=np.int64)
    if not cfg.anchor_data:
        n = store.n_texts
        if n <= ANCHOR_POOL:
            return None
        return np.sort(np.random.default_rng(ANCHOR_POOL_SEED).choice(n, ANCHOR_POOL, replace=False)).astype(np.int64)
    from headstore.heads.kinds import load_task, task_rows  # the dataset readers, only when named

    task = load_task(cfg.anchor_data, store, for_eval=True)
    corpus = task.corpus_rows if task.corpus_rows is not None else []  # an IR corpus: every document
    rows = np.unique(np.fromiter(task_rows(task) | {int(r) for r in corpus}, dtype=np.int64))
    if not len(rows):
        raise ValueError(f"--anchor-data {cfg.anchor_data}: none of its texts is in {store.path} (featurize it)")
    return rows


class AnchorSampler:
    """ANCHOR_ROWS anchor rows per step and head: (H, m) store rows from each head's own generator."""

    def __init__(self, n_rows: int, train_rows: np.ndarray, configs: list[TrainConfig],
                 rows: Optional[np.ndarray] = None):
        pool = np.arange(n_rows, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        pool = np.setdiff1d(pool, np.asarray(train_rows, dtype=np.int64))
        if not len(pool):
            raise ValueError("--anchor-weight: no store row is left once the training texts are taken out "
                             "(name other texts with --anchor-data)")
        self.pool = torch.as_tensor(pool)
        self.gens = [torch.Generator().manual_seed(c.seed + ANCHOR_SEED) for c in configs]
        self.m = min(ANCHOR_ROWS, len(pool))

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
