"""The SciFact taps study's table (bench/studies/taps_scifact.sh WORK): per seed, each head's dev and test nDCG@10,
its seen / unseen parts and head + memory (metrics.json), and Cranfield / CACM (its evals); then taps - default on
the seed-mean per-query nDCG@10 (pytrec_eval on the run files) with a paired percentile bootstrap over queries
(1,000 resamples), on SciFact test (all, seen, unseen: seen = a relevant document judged relevant for a train
claim, headstore's dev being carved from train), Cranfield and CACM.

    python3 bench/studies/taps_scifact_ci.py WORK --json bench/results/taps-scifact-zen4-DATE.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np
import pytrec_eval

RECIPES, SEEDS, TARGETS = ("default", "taps"), (0, 1, 2), ("cranfield", "cacm")


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    for line in path.read_text().splitlines()[1:]:
        query, doc, score = line.split("\t")
        qrels.setdefault(query, {})[doc] = int(score)
    return qrels


def per_query_ndcg(run_file: Path, qrels: dict) -> dict[str, float]:
    run: dict[str, dict[str, float]] = {}
    for line in run_file.read_text().splitlines():
        query, _, doc, _, score, _ = line.split()
        run.setdefault(query, {})[doc] = float(score)
    scores = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    return {q: v["ndcg_cut_10"] for q, v in scores.items()}


def seed_rows(work: Path) -> list[dict]:
    rows = []
    for recipe in RECIPES:
        for seed in SEEDS:
            m = json.loads((work / f"{recipe}-s{seed}" / "metrics.json").read_text())
            row = {"recipe": recipe, "seed": seed, "dev": m["dev"]["head"][m["primary"]],
                   "test": m["head"][m["primary"]], "frozen": m["baseline"][m["baseline_primary"]],
                   **{part: m["parts"][part]["head"] for part in ("seen", "unseen")},
                   "head+memory": m.get("memory", {}).get("test", {}).get("head+memory")}
            for target in TARGETS:
                e = json.loads((work / f"{recipe}-s{seed}-on-{target}" / "metrics.json").read_text())
                row[target], row[f"{target}_frozen"] = e["head"][e["primary"]], e["baseline"][e["baseline_primary"]]
            rows.append(row)
    return rows


def differences(work: Path, data: Path, rng) -> dict:
    out = {}
    for name, suffix in (("scifact", ""), *((t, f"-on-{t}") for t in TARGETS)):
        qrels = read_qrels(data / name / "qrels" / "test.tsv")
        mean = {}
        for recipe in RECIPES:
            runs = [per_query_ndcg(work / f"{recipe}-s{s}{suffix}" / "run.test.trec", qrels) for s in SEEDS]
            queries = sorted(runs[0])
            mean[recipe] = np.array([[r[q] for q in queries] for r in runs]).mean(0)  # (Q,) over seeds
        parts = {"all": np.ones(len(queries), bool)}
        if name == "scifact":
            judged = {doc for q in read_qrels(data / name / "qrels" / "train.tsv").values()
                      for doc, s in q.items() if s > 0}
            seen = np.array([any(d in judged and s > 0 for d, s in qrels[q].items()) for q in queries])
            parts.update(seen=seen, unseen=~seen)
        for part, mask in parts.items():
            diff = mean["taps"][mask] - mean["default"][mask]
            boots = [diff[rng.integers(0, len(diff), len(diff))].mean() for _ in range(1000)]
            out[f"{name}/{part}"] = {"n": int(mask.sum()), "default": float(mean["default"][mask].mean()),
                                     "taps": float(mean["taps"][mask].mean()), "taps_minus_default": float(diff.mean()),
                                     "ci95": [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("HEADSTORE_DATA", "../shared/datasets")))
    parser.add_argument("--json", type=Path, required=True)
    a = parser.parse_args()
    rows, diffs = seed_rows(a.work), differences(a.work, a.data, np.random.default_rng(0))
    print("| recipe | seed | dev | test | seen | unseen | head + memory | Cranfield | CACM |")
    for r in rows:
        print(f"| {r['recipe']} | {r['seed']} | {r['dev']:.4f} | {r['test']:.4f} | {r['seen']:.4f} | {r['unseen']:.4f} "
              f"| {r['head+memory'] or float('nan'):.4f} | {r['cranfield']:.4f} | {r['cacm']:.4f} |")
    for key, d in diffs.items():
        print(f"{key:18} n={d['n']:4d} default {d['default']:.4f} taps {d['taps']:.4f} "
              f"taps - default {d['taps_minus_default']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]")
    times = (a.work / "times.log").read_text().splitlines() if (a.work / "times.log").is_file() else []
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"rows": rows, "differences": diffs, "times": times,
                                  "machine": platform.processor() or platform.machine()}, indent=1))


if __name__ == "__main__":
    main()
