"""The labels kind's task: labelled texts joined to the feature store (`LabelTask`), their label codes and the
P x K batches they train in (heads.kinds.labels' module doc says what each holds)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from headstore.heads.kinds.base import Task, TrainSet


@dataclass(frozen=True)
class LabelSplit:
    """Labelled texts: store rows, the class of each (-1: a label absent from train) and its node per level."""

    rows: np.ndarray  # (n,) int64 store rows
    classes: np.ndarray  # (n,) int64 index into LabelTask.class_names; -1 = label not in train
    nodes: np.ndarray  # (n, D) int64 node per level (index into LabelTask.node_names[level]); -1 unknown
    full: bool = True  # probe, retrieval and per-level metrics too; False (dev, every epoch): k-NN only

    def __len__(self) -> int:
        return len(self.rows)

    def subset(self, idx: np.ndarray) -> "LabelSplit":
        return LabelSplit(self.rows[idx], self.classes[idx], self.nodes[idx], self.full)


@dataclass(frozen=True)
class LabelTrainSet(TrainSet):
    """The labelled texts with their codes, and the sizes of the codes' one-hot blocks (one per tree level with
    --hierarchy, () when flat): a classifier head's loss takes one softmax per block (heads.scoring.losses.ce)."""

    groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class LabelTask(Task):
    class_names: tuple[str, ...] = ()  # leaf labels seen in train, sorted
    level_names: tuple[str, ...] = ()  # one per level, coarse to fine (("label",) when flat)
    node_names: tuple[tuple[str, ...], ...] = ()  # per level: the node names (a path joined by " > ")
    leaf_nodes: np.ndarray | None = None  # (C, D) node per level of every class
    pool: LabelSplit | None = None  # train texts minus the dev slice (every train text for few-shot heads)
    every_train: LabelSplit | None = None  # every train text, the dev slice carved out of train included
    reference: LabelSplit | None = None  # the labelled texts k-NN / probe / retrieval use (= the training texts)
    report: dict = field(default_factory=dict)  # counts worth reporting: unseen labels, skipped, duplicates
    shots: int = 0  # what for_training built it for (checked against every config it trains)
    seed: int = 0  # the seed that drew the shots (0 when shots = 0)
    hierarchy: bool = False  # label codes with partial similarity between relatives
    per_class: int = 4  # K of the P x K batches
    coarse_of: np.ndarray | None = None  # (C,) each class's top-level node (a tree, or flat labels that look
    # hierarchical: heads.kinds.labels._coarse_of); None: no coarse level to score

    @property
    def hierarchical(self) -> bool:
        return len(self.level_names) > 1

    def codes(self, split: LabelSplit, hierarchy: bool) -> np.ndarray:
        """Label codes Y (n, L) float32 of a split's texts (see module doc); needs known classes."""
        if (split.classes < 0).any():
            raise ValueError("label codes need classes seen in train")
        if not hierarchy:
            return np.eye(len(self.class_names), dtype=np.float32)[split.classes]
        blocks = [np.eye(len(names), dtype=np.float32)[split.nodes[:, k]] for k, names in enumerate(self.node_names)]
        return np.concatenate(blocks, axis=1) / np.float32(math.sqrt(len(blocks)))

    def code_groups(self, hierarchy: bool) -> tuple[int, ...]:
        """Sizes of the codes' one-hot blocks: the nodes of each level (hierarchy), else () (one block)."""
        return tuple(len(names) for names in self.node_names) if hierarchy else ()

    def check_config(self, cfg) -> None:
        """ValueError unless this task was built by for_training for `cfg`'s data settings."""
        want = {"shots": cfg.shots, "hierarchy": cfg.hierarchy, "per_class": cfg.per_class,
                "seed": cfg.seed if cfg.shots else 0}
        have = {k: getattr(self, k) for k in want}
        if want != have:
            raise ValueError(f"{self.name}: this labelled-text task was built for {have} but a head asks "
                             f"for {want}; build it with heads.label_tasks.for_training(task, cfg)")

    def sample_batches(self, configs, gens: list[torch.Generator], B: int, steps: int) -> torch.Tensor:
        """(H, steps, b) indices into `train`: P classes x K texts per batch, per head (module doc)."""
        for cfg in configs:
            self.check_config(cfg)
        classes = self.reference.classes
        members = [np.flatnonzero(classes == c) for c in range(len(self.class_names))]
        members = [m for m in members if len(m)]
        K = self.per_class
        P = min(max(B // K, 2), len(members))
        out = []
        for g in gens:
            rng = np.random.default_rng(int(torch.randint(2 ** 62, (1,), generator=g)))
            queues = [rng.permutation(m) for m in members]
            heads = [0] * len(members)
            batches = []
            for _ in range(steps):
                batch = []
                for c in rng.choice(len(members), size=P, replace=False):
                    take = []
                    while len(take) < K:
                        if heads[c] == len(queues[c]):
                            queues[c], heads[c] = rng.permutation(members[c]), 0
                        n = min(K - len(take), len(queues[c]) - heads[c])
                        take.extend(queues[c][heads[c]:heads[c] + n])
                        heads[c] += n
                    batch.extend(take)
                batches.append(batch)
            out.append(batches)
        return torch.as_tensor(np.array(out, dtype=np.int64))  # (H, steps, P * K)
