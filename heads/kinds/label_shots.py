"""Which labelled texts a labels task holds out and which it trains on: the dev slice of train when the
dataset has no dev split (none for a few-shot head, whose shots are drawn from every train text), the n-per-class
shots of a few-shot head (heads.kinds.labels' module doc), and the
few-shot recipe's constants (LabelsKind.defaults_for).
"""
from __future__ import annotations

import math

import numpy as np

from headstore.heads.kinds.base import DEV_FRACTION, DEV_SEED


def stratified_dev(classes: np.ndarray, seed: int = DEV_SEED) -> np.ndarray:
    """Boolean mask: a DEV_FRACTION of each class's train texts (at least one of a class with >= 2)."""
    rng = np.random.default_rng(seed)
    dev = np.zeros(len(classes), dtype=bool)
    for c in np.unique(classes):
        idx = np.flatnonzero(classes == c)
        n = int(round(DEV_FRACTION * len(idx))) if len(idx) >= 2 else 0
        dev[rng.permutation(idx)[:max(n, 1 if len(idx) >= 2 else 0)]] = True
    return dev


def few_shot_indices(classes: np.ndarray, shots: int, seed: int) -> np.ndarray:
    """Indices of `shots` texts per class (all of a class with fewer), drawn with `seed`, sorted."""
    rng = np.random.default_rng(seed)
    picked = [rng.permutation(np.flatnonzero(classes == c))[:shots] for c in np.unique(classes[classes >= 0])]
    return np.sort(np.concatenate(picked))


def shots_clipped(task, shots: int) -> dict[str, int]:
    """{class: texts it has} of a LabelTask's classes with fewer than `shots` train texts (every train text: a
    few-shot head has no dev slice), which train on all of theirs: said, never silent (metrics.json
    data_report, the terminal)."""
    pool = task.pool if task.every_train is None else task.every_train
    counts = np.bincount(pool.classes[pool.classes >= 0], minlength=len(task.class_names))
    return {task.class_names[c]: int(n) for c, n in enumerate(counts) if n < shots}


def shots_note(shots: int, clipped: dict[str, int], listed: int = 10) -> str:
    """One line saying which classes have fewer than `shots` texts, with their counts (the first `listed`)."""
    named = ", ".join(f"{name} {n}" for name, n in list(clipped.items())[:listed])
    more = f", and {len(clipped) - listed} more" if len(clipped) > listed else ""
    return (f"--shots {shots} is more than {len(clipped)} class(es) have: each trains on all of its texts "
            f"({named}{more})")


FEW_SHOT_PASSES = 800  # a few-shot ce head's epochs x shots: about 250 optimiser steps on 20 classes at any n
# (batches of 64); 10 epochs of 8 shots are 30 steps, the head under-trained (docs/labels.md, "Few-shot default")


SELF_TRAIN_ROUNDS = 5  # a few-shot classifier head's self-training rounds, up to SELF_TRAIN_SHOTS shots. 20 Newsgroups
# dev, 3 seeds, vs the tuned LR: +4.5 points at 8 shots, +1.9 at 16 (beyond one standard error of dev accuracy,
# ~1.4), +0.35 at 64 (within it: the simpler head, the tuned LR's fit alone, is kept: the one-standard-error rule
# the probe's dev choice follows); 3 or 8 rounds, 32 or 128 texts a round no better (docs/labels.md)
SELF_TRAIN_SHOTS = 16


def few_shot_epochs(shots: int) -> int:
    """Epochs of a classifier head trained on `shots` texts per class: FEW_SHOT_PASSES / shots, 10 to 100."""
    return min(100, max(10, math.ceil(FEW_SHOT_PASSES / shots)))
