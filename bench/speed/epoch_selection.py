"""Benchmark: epoch selection on an IR dev split, exact L1 over every document vs L1 re-scored on the
SELECT_CANDIDATES nearest documents by L2 (heads.evaluation.evaluate.selection_scores), for a stack of heads.

Trains a stack of heads on SciFact (the default l1-energy settings, one seed per head), then, for the dev
and test splits: the time of each way, the largest difference in nDCG@10 between them, and the share of
(head, query) pairs whose exact L1 top 10 lies inside the candidates.

    python bench/speed/epoch_selection.py --store runs/store-minilm --heads 16 --json runs/bench-epoch-selection.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from headstore.featurize.store.reader import FeatureStore  # noqa: E402
from headstore.heads.settings.config import TrainConfig  # noqa: E402
from headstore.heads.scoring.energy import pairwise_energy  # noqa: E402
from headstore.heads.evaluation.evaluate import embedder, evaluate_split, selection_scores  # noqa: E402
from headstore.heads.kinds.ranking import SELECT_CANDIDATES, l1_on_candidates  # noqa: E402
from headstore.heads.network.features import load_features  # noqa: E402
from headstore.heads.settings.config import HeadConfig  # noqa: E402
from headstore.heads.kinds import load_task  # noqa: E402
from headstore.heads.training.train import train_stack  # noqa: E402
from headstore.heads.experiments.compare.datasets_root import datasets_root  # noqa: E402

DATA = datasets_root()


def top10_inside(zq: torch.Tensor, zd: torch.Tensor) -> float:
    """Share of (head, query) whose exact L1 top 10 documents are all among the L2 candidates."""
    exact = pairwise_energy("l1", zq, zd).topk(10, dim=-1, largest=False).indices  # (H, Q, 10)
    cand = l1_on_candidates(zq, zd, SELECT_CANDIDATES)  # +inf outside the candidates
    return float(torch.isfinite(torch.gather(cand, 2, exact)).all(-1).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True)
    ap.add_argument("--data", default=str(DATA / "scifact"))
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    store = FeatureStore.open(args.store)
    X = load_features(store)
    task = load_task(args.data, store)
    base = TrainConfig(loss="l1-energy", epochs=args.epochs, remine=False)
    configs = [dataclasses.replace(base, seed=s, lr=lr) for s in range(args.heads // 2) for lr in (1e-3, 3e-3)]
    model, norm, _ = train_stack(task, X, HeadConfig(in_dim=X.shape[1]), configs, progress=False)
    Xn = norm(X)
    embed = embedder(model, Xn)
    rows = []
    for split in ("dev", "test"):
        t0 = time.perf_counter()
        exact, _ = evaluate_split(task, split, embed, ("l1",))
        t1 = time.perf_counter()
        fast = selection_scores(task, split, embed, "l1")
        t2 = time.perf_counter()
        data = task.eval_sets[split]
        with torch.no_grad():
            inside = top10_inside(embed(data.query_rows).float(), embed(data.doc_rows).float())
        diffs = [abs(e["manhattan_ndcg@10"] - f) for e, f in zip(exact, fast)]
        rows.append({"split": split, "heads": len(configs), "queries": len(data.query_rows),
                     "documents": len(data.doc_rows), "exact_s": t1 - t0, "candidates_s": t2 - t1,
                     "speedup": (t1 - t0) / (t2 - t1), "max_ndcg10_diff": max(diffs),
                     "top10_inside_candidates": inside})
    print("| split | heads | queries | documents | exact L1 (s) | L1 on 100 L2 candidates (s) | speed-up | "
          "max nDCG@10 difference | exact top 10 inside the candidates |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['split']} | {r['heads']} | {r['queries']} | {r['documents']:,} | {r['exact_s']:.2f} | "
              f"{r['candidates_s']:.2f} | {r['speedup']:.1f}x | {r['max_ndcg10_diff']:.1e} | "
              f"{100 * r['top10_inside_candidates']:.2f}% |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
