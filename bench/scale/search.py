"""Benchmark: HNSW (approximate) vs the exact flat L1 index, recall@10 and query time.

A head's outputs of a corpus (stored features -> head, what `cli index` builds) are searched with the
head outputs of a query set (stored features of the queries) in one run: the exact `IndexFlat`
(`METRIC_L1`), `headstore`'s exact top-k (`pairwise_energy` + `topk_ranking`, the evaluator's path), and
`IndexHNSWFlat` for each M and efSearch. recall@10 = mean over queries of |HNSW top-10 ∩ exact top-10|
/ 10; times are per query set, best of `--repeat`, measured in this one run (compare ratios).

    python bench/scale/search.py --store runs/store-minilm --head runs/scifact-head \\
        --data ../shared/datasets/scifact --json runs/bench-search.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from headstore.featurize.store.api import Store  # noqa: E402
from headstore.heads.scoring.energy import pairwise_energy  # noqa: E402
from headstore.heads.artefacts.head import Head  # noqa: E402
from headstore.heads.scoring.ir_metrics import topk_ranking  # noqa: E402
from headstore.heads.apply.search import _metric, _prepare, corpus_items, recall_at_k  # noqa: E402


def best_of(fn, repeat: int):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    import faiss
    from tabulate import tabulate

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True)
    ap.add_argument("--head", required=True, help="a train-head dir or GRID#rank=K")
    ap.add_argument("--data", required=True, help="a BEIR folder: its corpus is indexed, its queries search")
    ap.add_argument("--m", default="8,16,32", help="HNSW links per node to try")
    ap.add_argument("--ef-search", default="16,32,64,128", help="HNSW query beams to try")
    ap.add_argument("--ef-construction", type=int, default=80)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    store, head = Store.open(args.store), Head.load(args.head)
    items = corpus_items(args.data)
    queries = [json.loads(line)["text"] for line in (Path(args.data) / "queries.jsonl").read_text().splitlines()]
    energy = head.energy_name
    zd = _prepare(head.embed(store.features(store.rows_for(items["text"].to_list()), array=head.array)), energy)
    zq = _prepare(head.embed(store.features(store.rows_for(queries), array=head.array)), energy)
    k, metric = args.k, _metric(faiss, energy)
    flat = faiss.IndexFlat(zd.shape[1], metric)
    flat.add(zd)
    t_flat, (_, exact) = best_of(lambda: flat.search(zq, k), args.repeat)
    t_torch, ranked = best_of(lambda: topk_ranking(pairwise_energy(energy, torch.from_numpy(zq), torch.from_numpy(zd)),
                                                   k=k), args.repeat)
    rows = [{"index": "flat (exact)", "M": None, "ef_search": None, "build_s": 0.0, "search_s": t_flat,
             f"recall@{k}": 1.0},
            {"index": "headstore exact (torch)", "M": None, "ef_search": None, "build_s": 0.0, "search_s": t_torch,
             f"recall@{k}": recall_at_k(ranked.numpy(), exact)}]
    for m in (int(x) for x in args.m.split(",")):
        index = faiss.IndexHNSWFlat(zd.shape[1], m, metric)
        index.hnsw.efConstruction = args.ef_construction
        t_build, _ = best_of(lambda: index.add(zd), 1)
        for ef in (int(x) for x in args.ef_search.split(",")):
            index.hnsw.efSearch = ef
            t, (_, found) = best_of(lambda: index.search(zq, k), args.repeat)
            rows.append({"index": "hnsw", "M": m, "ef_search": ef, "build_s": t_build, "search_s": t,
                         f"recall@{k}": recall_at_k(found, exact)})
    info = {"store": args.store, "head": args.head, "data": args.data, "energy": energy, "n_corpus": len(zd),
            "n_queries": len(zq), "dim": zd.shape[1], "k": k, "ef_construction": args.ef_construction,
            "faiss": faiss.__version__, "rows": rows}
    print(f"{Path(args.data).name}: {len(zd)} documents, {len(zq)} queries, dim {zd.shape[1]}, {energy} energy")
    print(tabulate([[r["index"], r["M"] or "", r["ef_search"] or "", f"{r['build_s']:.3f}", f"{r['search_s'] * 1e3:.1f}",
                     f"{r[f'recall@{k}']:.4f}"] for r in rows],
                   headers=["index", "M", "efSearch", "build s", "search ms (all queries)", f"recall@{k} vs exact"],
                   tablefmt="github", disable_numparse=True))
    if args.json:
        Path(args.json).write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
