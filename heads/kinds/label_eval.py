"""The labels kind's evaluator (heads.kinds.labels): linear probe, k-NN under an energy, retrieval view.

The labelled set is the task's `reference` (the texts the head was trained on: every train text
but the dev slice, or the few-shot sample). For every evaluated text (one `dict[str, float]` per head):
- `probe_accuracy`, `probe_macro_f1`: sklearn's default `LogisticRegression` (C = 1) on L2-normalised
  embeddings (so raw features and a head's outputs, whatever their scale, get the same
  regularisation; SetFit's default head on normalised MiniLM embeddings is the same probe), fitted on
  the labelled set; the frozen baseline is the same probe on the stored features. (Standardising
  instead over-fits: 20 Newsgroups, all train texts, frozen MiniLM: 0.684 vs 0.751 accuracy.)
- `{p}_knn_accuracy`, `{p}_knn_macro_f1`: majority vote of the k = 10 lowest-energy labelled texts
  (ties: the class whose nearest member ranks first), `p` the energy's prefix (`manhattan` = L1);
- `{p}_ndcg@10`, `{p}_map`: each text ranks every labelled text by energy; a hit shares its label
  (binary gain). MAP over the whole ranking; texts whose label is absent from train have no hit
  and are left out of these two (as trec_eval leaves out queries without relevant documents);
- for hierarchies, `probe_accuracy_<level>` and `{p}_knn_accuracy_<level>`: the predicted label's
  ancestor at that level against the true one.
Texts whose label never occurs in train count as errors in accuracy (no classifier can name it).
A split with `full=False` (dev, evaluated every epoch for selection) gets the k-NN metrics only.
Macro-F1 averages over the classes of train.
"""
from __future__ import annotations

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import Normalizer

from headstore.heads.scoring.energy import pairwise_energy
from headstore.heads.kinds.base import PREFIX
from headstore.heads.scoring.metrics import ndcg_and_ap

KNN_K = 10  # neighbours voting in k-NN accuracy (the k)
PROBE_MAX_ITER = 1000  # lbfgs iterations: the default 100 stops short on 10k x 384 features
CHUNK = 512  # queries per energy block: (512, N) energies and their ranking in memory at once


def probe_predict(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, seed: int = 0) -> np.ndarray:
    """Classes predicted by a logistic-regression probe on L2-normalised inputs fitted on (train_x, train_y)."""
    probe = make_pipeline(Normalizer(), LogisticRegression(max_iter=PROBE_MAX_ITER, random_state=seed))
    probe.fit(train_x, train_y)
    return probe.predict(test_x)


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
    return out, correct


def evaluate_labels(task, split: str, embed, energies: tuple[str, ...]) -> tuple[list[dict], list[dict]]:
    """Metrics per head on one split (module doc); items per head: per-text k-NN correctness under each
    energy prefix (and `probe` correctness) for bootstrap CIs."""
    data, ref = task.eval_sets[split], task.reference
    zq, zr = embed(data.rows, "query"), embed(ref.rows, "document")  # (H, n, d), (H, m, d): texts against references
    C = len(task.class_names)
    results, items = [], []
    for h in range(zq.shape[0]):
        metrics, item = {}, {}
        if data.full:
            pred = probe_predict(zr[h].double().cpu().numpy(), ref.classes, zq[h].double().cpu().numpy())
            m, item["probe"] = _classifier_metrics("probe", pred, data, task)
            metrics.update(m)
        for energy in energies:
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
