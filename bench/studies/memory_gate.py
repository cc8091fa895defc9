"""Can the document memory stop hurting new documents? A gate on NUDGE-N, and a memory keyed by training queries.

The memory (docs/memory.md) moves each judged document toward its training queries, so a judged document can
climb into the ranking of a query about something else: on SciFact's unseen claims frozen + memory is ~1 point
under the frozen features. Two ways to let the memory act only where a query resembles what it was fitted on,
on the frozen features (no head: what is measured is the memory itself):

- gated NUDGE-N: a judged document answers with its edited vector only to a query whose cosine to one of that
  document's training queries exceeds tau; to every other query it keeps its frozen vector. tau = -1 is the
  memory as shipped; tau = 1 is no memory.
- a keyed memory: a judged document's score is max(cos(q, d), alpha * max_k cos(q, k)) over its training queries
  k ("max"), or cos(q, d) + alpha * relu(max_k cos(q, k) - tau) ("add"): its training queries kept as extra keys.

Every setting is fitted on the training judgements and scored on dev; test is reported for every tau (the
trade-off) and, for each family, at the setting dev chose, with the memory refitted on train + dev as train-head
does. Test claims split into seen / unseen as everywhere (a relevant abstract judged in train or dev), each with a
paired 95% bootstrap CI over claims against the frozen features.

    python3 bench/studies/memory_gate.py --store STORE --json OUT.json [--data DATASETS/scifact]
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))

from headstore.heads.experiments.compare.datasets_root import datasets_root  # noqa: E402
from headstore.heads.kinds.seen import seen_parts  # noqa: E402
from headstore.heads.training.memory_fit import dev_pairs, fit_memory  # noqa: E402
from limits import machine, machine_line  # noqa: E402
from memory_study import parts, setup  # noqa: E402

TAUS = (-1.0, 0.4, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 1.0)
KEYED = {"max": [(a, 0.0) for a in (0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2)],
         "add": [(a, t) for a in (0.5, 1.0, 2.0, 4.0) for t in (0.5, 0.6, 0.7, 0.8, 0.85, 0.9)]}


def ndcg10(split, scores: torch.Tensor) -> np.ndarray:
    """(Q,) nDCG@10 of each query of `split` from its (Q, N) scores over split.doc_rows (binary or graded qrels)."""
    ids, top, out = np.asarray(split.doc_ids), torch.topk(scores, 10, dim=1).indices.numpy(), []
    discount = 1 / np.log2(np.arange(2, 12))
    for i, qid in enumerate(split.query_ids):
        rel = split.qrels.get(qid, {})
        dcg = float(np.dot([rel.get(ids[j], 0) for j in top[i]], discount))
        ideal = sorted((g for g in rel.values() if g > 0), reverse=True)[:10]
        idcg = float(np.dot(ideal, discount[:len(ideal)]))
        out.append(dcg / idcg if idcg > 0 else 0.0)
    return np.array(out)


def best_key(split, X, judged) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(frozen scores S (Q, N), each document's best cosine to one of its training queries M (Q, N; -9 where the
    document is not judged), the split's document columns)."""
    Q, D = X[torch.as_tensor(np.asarray(split.query_rows))], X[torch.as_tensor(np.asarray(split.doc_rows))]
    col = {int(r): j for j, r in enumerate(np.asarray(split.doc_rows))}
    queries, docs = judged
    cos = Q @ X[torch.as_tensor(queries)].T  # (Q, P): each query against each judgement's query
    M = torch.full((len(Q), len(D)), -9.0)
    M.scatter_reduce_(1, torch.as_tensor([col[int(d)] for d in docs]).expand(len(Q), -1), cos, reduce="amax")
    return Q @ D.T, M, Q


def gated_scores(split, X, judged, memory, tau: float) -> torch.Tensor:
    S, M, Q = best_key(split, X, judged)
    col = {int(r): j for j, r in enumerate(np.asarray(split.doc_rows))}
    edited = X[torch.as_tensor(np.asarray(split.doc_rows))].clone()
    edited[torch.as_tensor([col[int(r)] for r in memory.positions])] = memory.vectors.float()
    return torch.where(M > tau, Q @ edited.T, S)


def keyed_scores(split, X, judged, mode: str, alpha: float, tau: float) -> torch.Tensor:
    S, M, _ = best_key(split, X, judged)
    return torch.maximum(S, alpha * M) if mode == "max" else S + alpha * torch.relu(M - tau)


def row(values: np.ndarray, frozen: np.ndarray, mask: np.ndarray) -> dict:
    return {p: {"value": v["head"], "minus_frozen": v["delta"], "ci": v["ci"]["delta"], "n": v["n"]}
            for p, v in seen_parts(frozen, values, mask).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--data", default=None, help="the IR dataset (default: DATASETS_ROOT/scifact)")
    args = ap.parse_args()
    _, task, X, _, _ = setup(args.store, args.data or str(datasets_root() / "scifact"))
    X = torch.nn.functional.normalize(X.float(), dim=-1)
    dev, test = task.eval_sets["dev"], task.eval_sets["test"]
    train = (np.asarray(task.train.anchor), np.asarray(task.train.positive))
    dq, dd = dev_pairs(task)
    both = (np.concatenate([train[0], dq]), np.concatenate([train[1], dd]))
    mask = parts(task)["seen"]
    frozen = ndcg10(test, X[torch.as_tensor(test.query_rows)] @ X[torch.as_tensor(test.doc_rows)].T)
    fitted = fit_memory(task, X, None, None, "cosine", "features", "nudge-n", refit=False)  # dev stays held out
    refit = fit_memory(task, X, None, None, "cosine", "features", "nudge-n")  # train + dev at dev's strength
    rows, dev_of = {}, {}
    for tau in TAUS:
        name = f"gated nudge-n, tau {tau:+.2f}"
        dev_of[name] = float(ndcg10(dev, gated_scores(dev, X, train, fitted, tau)).mean())
        rows[name] = row(ndcg10(test, gated_scores(test, X, both, refit, tau)), frozen, mask)
    for mode, grid in KEYED.items():
        devs = {(a, t): float(ndcg10(dev, keyed_scores(dev, X, train, mode, a, t)).mean()) for a, t in grid}
        a, t = max(devs, key=devs.get)
        name = f"keyed ({mode}), alpha {a}, tau {t} (dev's choice)"
        dev_of[name] = devs[(a, t)]
        rows[name] = row(ndcg10(test, keyed_scores(test, X, both, mode, a, t)), frozen, mask)
    m = machine()
    print(machine_line(m))
    print(f"SciFact test nDCG@10, frozen features: all {frozen.mean():.4f}, seen {frozen[mask].mean():.4f} "
          f"({int(mask.sum())}), unseen {frozen[~mask].mean():.4f} ({int((~mask).sum())}); memory strength "
          f"{refit.gamma} (dev)")
    print(f"{'memory':48s} {'dev':>7s}" + "".join(f"{p:>32s}" for p in ("seen", "unseen", "all")))
    for name, r in rows.items():
        cells = [f"{r[p]['value']:.4f} {r[p]['minus_frozen']:+.4f} [{r[p]['ci'][0]:+.3f},{r[p]['ci'][1]:+.3f}]"
                 for p in ("seen", "unseen", "all")]
        print(f"{name:48s} {dev_of[name]:7.4f}" + "".join(f"{c:>32s}" for c in cells))
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "machine": m,
           "store": args.store, "memory": refit.describe(), "frozen": {"all": float(frozen.mean()),
           "seen": float(frozen[mask].mean()), "unseen": float(frozen[~mask].mean())}, "dev": dev_of, "rows": rows}
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
