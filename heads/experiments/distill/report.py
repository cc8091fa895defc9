"""What `cli distill` scores beside the distilled head: the frozen features, the best single pair-trained head
and the teacher, in domain (dev, test with CIs) and out of domain (`--transfer` sets), and each one's cost.

- The best single head: `--single REF` (any head over the store), else for an ensemble teacher its member with
  the best dev figure (a grid ensemble's members are single pair-trained heads); none for a one-head teacher.
- Out of domain: each `--transfer` dataset without any item that shares a text with the in-domain dataset or its
  `--unlabeled` texts (the student trained on both: counted, on the terminal and in metrics.json
  "transfer_dropped"; heads.kinds.without_seen), on its test split (else the whole table), as `cli grid
  --transfer` scores it.
- Seen / unseen: each column's dev and test figures also on the queries a relevant document of which the training
  judged and on the others (heads.kinds.seen; "parts").
- Cost: seconds to score 1,000 queries against the corpus (the task's corpus; for a pairs or STS table the
  distillation's candidate texts): the queries through normaliser and head, their energies to every corpus
  text and the top 10 of each, the corpus embedded beforehand (an index holds it), on this process's
  threads; timed on 250 queries (linear in them) and scaled; and the parameters.

Everything but the student is scored before the student trains (training normalises the task's features in
place); `Beside.student` scores the student after.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from headstore.heads.artefacts.head import EnsembleHead, Head
from headstore.heads.artefacts.task_features import TaskFeatures
from headstore.heads.evaluation.evaluate import TEST_SPLIT, embedder, evaluate_baseline, evaluate_head, evaluate_split
from headstore.heads.experiments.grid.inputs import transfer_split
from headstore.heads.kinds import load_task, overlap_line, primary_metric, seen_rows, task_seen_masks, without_seen
from headstore.heads.scoring.energy import pairwise_energy

SPLITS = ("dev", TEST_SPLIT)
COST_QUERIES = 1000  # the unit: seconds to score 1,000 queries against the corpus
COST_TIMED = 250  # queries timed (one chunk: 250 x corpus energies in memory), scaled to COST_QUERIES


def n_parameters(head) -> int:
    """Parameters of a Head, an EnsembleHead (all members) or a stacked model."""
    if isinstance(head, torch.nn.Module):
        return sum(p.numel() for p in head.parameters())
    return sum(p.numel() for m in getattr(head, "members", [head]) for p in m.model.parameters())


def to_device(head: Head, device) -> Head:
    for m in getattr(head, "members", [head]):
        m.model, m.normalizer = m.model.to(device), m.normalizer.to(device)
    return head


def best_member(teacher: Head, task, features: torch.Tensor, dim: int) -> Head | None:
    """The ensemble teacher's member with the best dev figure (module doc); None for a one-head teacher."""
    if not isinstance(teacher, EnsembleHead) or "dev" not in task.eval_sets:
        return None
    metric = primary_metric(task.kind, teacher.energy_name)

    def dev(m: Head) -> float:
        res, _ = evaluate_split(task, "dev", embedder(m.model, features, m.normalizer), (m.energy_name,))
        return res[0][metric]
    return max(teacher.members, key=dev)


def transfer_tasks(task, store, paths, device, data: str) -> tuple[dict, dict]:
    """(name -> (the out-of-domain task at positions, its TaskFeatures), name -> {what: {split: dropped}}), without
    items sharing a text with `task` or its --unlabeled texts (store rows: call before the task is remapped);
    data: how the user named the task ("--data FILE")."""
    out, dropped, seen = {}, {}, seen_rows(task, data)
    for path in paths:
        t, lost = without_seen(load_task(path, store, for_eval=True), seen, f"--transfer {path}", transfer_split)
        if lost:
            print(overlap_line(f"--transfer {path}", lost))
            dropped[t.name] = lost
        tf = TaskFeatures.for_task(store, t, device=device)
        out[t.name] = (tf.remap(t), tf)
    return out, dropped


def read_stored(tf: TaskFeatures, array: str) -> torch.Tensor:
    return tf.read(array)


def score_transfer(ood: dict, model, norm, energy: str, array: str = "features", dim: int | None = None,
                   read=read_stored) -> dict:
    """{name: primary metric} of one head (model None: the frozen features, the first `dim` columns) on each
    out-of-domain set; `read(tf, array)`: the features the head takes (a tuned-encoder teacher's own)."""
    out = {}
    for name, (t, tf) in ood.items():
        X = read(tf, array) if dim is None else read(tf, array)[:, :dim]
        res, _ = evaluate_split(t, transfer_split(t), embedder(model, X, norm), (energy,))
        out[name] = res[0][primary_metric(t.kind, energy)]
    return out


def scoring_seconds(model, norm, energy: str, queries: torch.Tensor, corpus: torch.Tensor) -> float:
    """Seconds to score COST_QUERIES raw query features against the pre-embedded corpus (module doc)."""
    z_docs = embedder(model, corpus, norm)(np.arange(len(corpus)), "document")[0]
    t0 = time.perf_counter()
    zq = embedder(model, queries, norm)(np.arange(len(queries)), "query")[0]
    e = pairwise_energy(energy, zq, z_docs)
    torch.topk(e, min(10, e.shape[1]), dim=1, largest=False)
    return (time.perf_counter() - t0) * COST_QUERIES / len(queries)


def split_parts(metrics: dict) -> dict:
    """{"parts": {split: seen / unseen / all}} of an evaluate_head result (heads.kinds.seen), {} without them."""
    parts = {s: b["parts"] for s, b in ((TEST_SPLIT, metrics), ("dev", metrics.get("dev", {}))) if "parts" in b}
    return {"parts": parts} if parts else {}


class Beside:
    """The columns beside the student (module doc), scored on the raw features before training. `items`, when
    given, is filled with each column's per-item test values (what the CIs resample) and the gold labels."""

    def __init__(self, task, store, tf: TaskFeatures, array: str, teacher: Head, single: Head | None,
                 ood: dict, cost_rows: tuple[np.ndarray, np.ndarray], device, items: dict | None = None,
                 teacher_read=read_stored):
        self.task, self.dim, self.array, self.items = task, store.dim, array, items
        self.seen = task_seen_masks(task, SPLITS)  # seen / unseen queries (heads.kinds.seen; positions: the same)
        features = tf.read(array)
        q, c = (torch.as_tensor(r, device=tf.device) for r in (np.resize(cost_rows[0], COST_TIMED), cost_rows[1]))
        self.cost_inputs = {(a, read): (read(tf, a)[q].clone(), read(tf, a)[c].clone()) for a, read in
                            {(array, read_stored), (teacher.array, teacher_read),
                             *([(single.array, read_stored)] if single else [])}}
        self.ood = ood  # transfer_tasks(the task in store rows, ...)
        self.baseline = evaluate_baseline(task, features, SPLITS, dim=store.dim)
        cost = [x[:, :store.dim] for x in self.cost_inputs[array, read_stored]]
        self.columns = {"frozen": {"parameters": 0, "transfer": score_transfer(self.ood, None, None, "cosine",
                                                                              array, store.dim),
                                   "seconds_per_1000": scoring_seconds(None, None, "cosine", *cost)}}
        for name, head, read in (("single", single, read_stored), ("teacher", teacher, teacher_read)):
            if head is not None:
                head = to_device(head, device)
                self.columns[name] = self._column(name, head, read(tf, head.array), read)

    def _column(self, name: str, head: Head, features: torch.Tensor, read) -> dict:
        items = {} if self.items is not None else None
        m = evaluate_head(self.task, features, head.model, head.normalizer, head.energy_name, SPLITS, dim=self.dim,
                          baseline=self.baseline, items=items, seen=self.seen)
        self._keep(items, name)
        col = {"ref": str(head.source), "primary": m["primary"], "head": m.get("head"),
               "ci": m.get("ci", {}).get("head"), "parameters": n_parameters(head),
               "transfer": score_transfer(self.ood, head.model, head.normalizer, head.energy_name, head.array,
                                          read=read),
               "seconds_per_1000": scoring_seconds(head.model, head.normalizer, head.energy_name,
                                                   *self.cost_inputs[head.array, read])}
        if "dev" in m:
            col["dev"] = m["dev"]["head"]
        return col | split_parts(m)

    def _keep(self, items: dict | None, name: str) -> None:
        if items is None or TEST_SPLIT not in items:
            return
        self.items.setdefault("frozen", np.asarray(items[TEST_SPLIT]["baseline"]))
        self.items[name] = np.asarray(items[TEST_SPLIT]["head"])
        labels = getattr(self.task.eval_sets[TEST_SPLIT], "labels", None)
        if labels is not None:
            self.items.setdefault("gold", np.asarray(labels))

    def student(self, model, norm, energy: str, features: torch.Tensor) -> dict:
        """metrics.json of the student (features: as training left them, normalised; `norm` applies to raw
        ones) with its transfer and cost."""
        items = {} if self.items is not None else None
        metrics = evaluate_head(self.task, features, model, None, energy, SPLITS, dim=self.dim,
                                baseline=self.baseline, items=items, seen=self.seen)
        self._keep(items, "distilled")
        self.columns["distilled"] = {"parameters": n_parameters(model),
                                     "transfer": score_transfer(self.ood, model, norm, energy, self.array),
                                     "seconds_per_1000": scoring_seconds(model, norm, energy,
                                                                         *self.cost_inputs[self.array, read_stored])}
        return metrics
