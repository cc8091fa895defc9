"""The labels kind's evaluator (heads.kinds.labels): linear probe, k-NN under an energy, retrieval view.

The labelled set is the task's `reference` (the texts the head was trained on: every train text
but the dev slice, or the few-shot sample). For every evaluated text (one `dict[str, float]` per head):
- `probe_accuracy`, `probe_macro_f1`: a logistic-regression probe fitted on the labelled set, tuned
  (heads.kinds.label_probe: C and the input scaling chosen on dev, or by cross-validation on the labelled
  texts when there is no dev: few-shot), with the choice as `probe_C` and `probe_standardize`; the frozen
  baseline is the same tuned probe on the stored features, a head's on its outputs;
- `classifier_accuracy`, `classifier_macro_f1` (a classifier head, loss ce, scored under `CLASSES`): the
  argmax of its class scores (`class_scores`: its outputs, or with one softmax per tree level the sum of
  each leaf's levels' log-probabilities);
- `{p}_knn_accuracy`, `{p}_knn_macro_f1`: majority vote of the k = 10 lowest-energy labelled texts
  (ties: the class whose nearest member ranks first), `p` the energy's prefix (`manhattan` = L1);
- `{p}_ndcg@10`, `{p}_map`: each text ranks every labelled text by energy; a hit shares its label
  (binary gain). MAP over the whole ranking; texts whose label is absent from train have no hit
  and are left out of these two (as trec_eval leaves out queries without relevant documents);
- for hierarchies, `probe_accuracy_<level>` and `{p}_knn_accuracy_<level>`: the predicted label's
  ancestor at that level against the true one; for flat labels that look hierarchical (`TREC:fine` read without
  --label-sep), `..._accuracy_coarse`: the same at the top level (the part before the separator).
Texts whose label never occurs in train count as errors in accuracy (no classifier can name it).
A split with `full=False` (dev, evaluated every epoch for selection) gets the k-NN metrics only.
Macro-F1 averages over the classes of train.
"""
from __future__ import annotations

import numpy as np
import torch
from sklearn.metrics import f1_score

from headstore.heads.scoring.energy import pairwise_energy
from headstore.heads.kinds.base import PREFIX
from headstore.heads.kinds.label_probe import tuned_probe
from headstore.heads.scoring.losses import CLASSES
from headstore.heads.scoring.ir_metrics import ndcg_and_ap

KNN_K = 10  # neighbours voting in k-NN accuracy (the k)
CHUNK = 512  # queries per energy block: (512, N) energies and their ranking in memory at once


def class_scores(z: torch.Tensor, leaf_nodes: np.ndarray, widths: list[int]) -> torch.Tensor:
    """(..., L) outputs of a classifier head -> (..., C) scores of the classes (argmax = the prediction).

    leaf_nodes (C, D): each class's node per level of the label tree; widths: the nodes of each level. L = C:
    the outputs are the leaf classes' scores (one softmax). L = sum(widths) (one softmax per level,
    `--hierarchy`, heads.kinds.labels.classifier_width): a class scores the sum over levels of its node's
    log-probability in that level's softmax."""
    C = len(leaf_nodes)
    if z.shape[-1] == C:
        return z
    if z.shape[-1] != sum(widths):
        raise ValueError(f"a classifier head with {z.shape[-1]} outputs fits neither the {C} classes nor the "
                         f"{sum(widths)} nodes of the label tree")
    offsets = np.cumsum([0] + list(widths[:-1]))
    logp = torch.cat([torch.log_softmax(block, dim=-1) for block in z.split(list(widths), dim=-1)], dim=-1)
    columns = torch.as_tensor(np.asarray(leaf_nodes) + offsets, device=z.device)  # (C, D) columns of logp
    return logp[..., columns].sum(-1)


def knn_vote(neighbour_classes: torch.Tensor, n_classes: int) -> torch.Tensor:
    """(n, k) classes of the nearest labelled texts, nearest first -> (n,) majority class.

    A tie goes to the class whose nearest member ranks first (a bonus of 1e-3 / (rank + 1) < 1 vote)."""
    n, k = neighbour_classes.shape
    bonus = 1e-3 / torch.arange(1, k + 1, dtype=torch.float64)
    votes = torch.zeros(n, n_classes, dtype=torch.float64)
    votes.scatter_add_(1, neighbour_classes, 1.0 + bonus.expand(n, k))
    return votes.argmax(1)


def ranking_metrics(energies: torch.Tensor, query_classes: np.ndarray, ref_classes: np.ndarray, n_classes: int,
                    full: bool) -> dict[str, np.ndarray]:
    """Per query: k-NN prediction and, with `full`, nDCG@10 and average precision (NaN without a hit)."""
    ref, energies = torch.as_tensor(ref_classes), energies.cpu()  # (m,), (c, m): labelled sets are small
    k = min(KNN_K, energies.shape[1])
    if not full:
        top = torch.topk(energies, k, dim=1, largest=False).indices
        return {"knn": knn_vote(ref[top], n_classes).numpy()}
    order = torch.argsort(energies, dim=1, stable=True)  # (c, m)
    rel = (ref[order] == torch.as_tensor(query_classes)[:, None]).numpy()  # (c, m) binary gains
    n_rel = rel.sum(1)  # (c,): every labelled text is ranked
    ideal = np.arange(min(10, rel.shape[1])) < n_rel[:, None]  # (c, 10): n_rel ones (only 10 count)
    ndcg, ap = ndcg_and_ap(rel, ideal, n_rel, (10,))  # NaN where n_rel = 0
    return {"knn": knn_vote(ref[order[:, :k]], n_classes).numpy(), "ndcg@10": ndcg[10], "map": ap}


def _classifier_metrics(name: str, pred: np.ndarray, split, task) -> tuple[dict, np.ndarray]:
    correct = (pred == split.classes).astype(np.float64)
    out = {f"{name}_accuracy": float(correct.mean()),
           f"{name}_macro_f1": float(f1_score(split.classes, pred, labels=np.arange(len(task.class_names)),
                                              average="macro", zero_division=0))}
    if task.hierarchical and split.full:
        pred_nodes = task.leaf_nodes[pred]  # (n, D)
        for k, level in enumerate(task.level_names):
            out[f"{name}_accuracy_{level}"] = float((pred_nodes[:, k] == split.nodes[:, k]).mean())
    elif task.coarse_of is not None and split.full:  # flat labels that look hierarchical: their top level
        known = split.classes >= 0
        out[f"{name}_accuracy_coarse"] = float((known & (task.coarse_of[pred] == task.coarse_of[split.classes])).mean())
    return out, correct


def probe_choices(task, embed) -> list[tuple] | None:
    """Per head, the tuned probe fitted on the labelled set, and its choice (heads.kinds.label_probe): chosen on
    the dev split where the task has one, else by cross-validation; None when no split is scored in full."""
    ref, dev = task.reference, task.eval_sets.get("dev")
    zr = embed(ref.rows, "document").double().cpu().numpy()  # (H, m, d)
    zd = embed(dev.rows, "query").double().cpu().numpy() if dev is not None else None
    return [tuned_probe(zr[h], ref.classes, None if zd is None else (zd[h], dev.classes)) for h in range(len(zr))]


def evaluate_labels(task, split: str, embed, energies: tuple[str, ...],
                    probes: list[tuple] | None = None) -> tuple[list[dict], list[dict]]:
    """Metrics per head on one split (module doc); items per head: per-text correctness under each energy
    prefix (k-NN; `classifier` for CLASSES) and `probe` for bootstrap CIs. `probes`: `probe_choices` made already."""
    data, ref = task.eval_sets[split], task.reference
    zq = embed(data.rows, "query")  # (H, n, d)
    knn = [e for e in energies if e != CLASSES]
    zr = embed(ref.rows, "document") if knn else None  # (H, m, d): texts against references
    if data.full and probes is None:
        probes = probe_choices(task, embed)
    C = len(task.class_names)
    results, items = [], []
    for h in range(zq.shape[0]):
        metrics, item = {}, {}
        if data.full:
            probe, choice = probes[h]
            m, item["probe"] = _classifier_metrics("probe", probe.predict(zq[h].double().cpu().numpy()), data, task)
            metrics.update(m | choice.metrics())
        if CLASSES in energies:
            scores = class_scores(zq[h].float(), task.leaf_nodes, [len(names) for names in task.node_names])
            pred = scores.argmax(-1).cpu().numpy()
            m, item[PREFIX[CLASSES]] = _classifier_metrics(PREFIX[CLASSES], pred, data, task)
            metrics.update(m)
        for energy in knn:
            p = PREFIX[energy]
            parts = [ranking_metrics(pairwise_energy(energy, zq[h, s:s + CHUNK], zr[h]), data.classes[s:s + CHUNK],
                                     ref.classes, C, data.full) for s in range(0, len(data), CHUNK)]
            joined = {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
            m, item[p] = _classifier_metrics(f"{p}_knn", joined["knn"], data, task)
            metrics.update(m)
            for key in ("ndcg@10", "map"):
                if key in joined:
                    metrics[f"{p}_{key}"] = float(np.nanmean(joined[key])) if np.isfinite(joined[key]).any() else float("nan")
        results.append(metrics)
        items.append(item)
    return results, items
