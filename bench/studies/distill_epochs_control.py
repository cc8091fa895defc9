"""A control for a distilled student's gain over its single head: the single head's own recipe trained for more
epochs, as many pair-loss steps as the student took (each distillation step also takes a batch of the pairs, so a
student over 2,727 anchors takes ~3.3x the single head's pair batches). Per seed: `cli train-head`'s run with the
single head's settings and --epochs N; then per-query nDCG@10 (pytrec_eval over each head's run.test.trec) of the
students (evaluated with `cli eval` into WORK/eval-*), the control and the single head, and two-level 95% CIs of
the differences (heads.scoring.bootstrap), as JSON.

    python3 bench/studies/distill_epochs_control.py --store S --single 'COMPARE/head-base-s{seed}-*/head' \\
        --students 'WORK/runs/tuned/tuned-*-with-seed{seed}/head' --epochs 33 --work WORK/control --json OUT.json
"""
from __future__ import annotations

import argparse
import glob
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from headstore.heads.artefacts.head import Head  # noqa: E402
from headstore.heads.experiments.compare.datasets_root import datasets_root  # noqa: E402
from headstore.heads.scoring.bootstrap import two_level_ci  # noqa: E402
from headstore.heads.training.run import train_head  # noqa: E402


def one(pattern: str, seed: int) -> str:
    found = sorted(glob.glob(pattern.format(seed=seed)))
    if len(found) != 1:
        raise SystemExit(f"{pattern}: {len(found)} matches for seed {seed}")
    return found[0]


def per_query(run_file: Path, qrels: dict) -> np.ndarray:
    import pytrec_eval

    run: dict = {}
    for line in run_file.read_text().splitlines():
        q, _, d, _, score, _ = line.split()
        run.setdefault(q, {})[d] = float(score)
    got = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    return np.array([got.get(q, {}).get("ndcg_cut_10", 0.0) for q in sorted(qrels)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--single", required=True, help="The single head of each seed: a glob with {seed}.")
    parser.add_argument("--students", required=True, help="The distilled head of each seed: a glob with {seed}.")
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--work", required=True)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    data = datasets_root() / "scifact"
    qrels: dict = {}
    for line in (data / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        q, d, g = line.split("\t")
        qrels.setdefault(q, {})[d] = int(g)
    work, seeds = Path(args.work), [int(s) for s in args.seeds.split(",")]
    items: dict = {"single": [], "control": [], "distilled": []}
    for seed in seeds:
        single = Head.load(one(args.single, seed))
        out = work / f"control-e{args.epochs}-s{seed}"
        train_head(args.store, str(data), str(out), single.head_config,
                   single.train_config.replace(epochs=args.epochs, seed=seed), progress=False, overwrite=True)
        evaluated = work / f"eval-student-s{seed}"
        subprocess.run(["cli", "eval", "--store", args.store, "--head", one(args.students, seed), "--data", str(data),
                        "--out", str(evaluated), "--overwrite"], check=True, capture_output=True)
        items["control"].append(per_query(out / "run.test.trec", qrels))
        items["distilled"].append(per_query(evaluated / "run.test.trec", qrels))
        items["single"].append(per_query(Path(one(args.single, seed)) / "run.test.trec", qrels))
    arrays = {k: np.stack(v) for k, v in items.items()}  # (seeds, queries)
    result = {"epochs": args.epochs, "seeds": seeds, "test": {k: float(v.mean()) for k, v in arrays.items()},
              "per_seed": {k: v.mean(1).tolist() for k, v in arrays.items()},
              "ci": {"distilled - control": two_level_ci(arrays["distilled"], 1000, minus=arrays["control"]),
                     "control - single": two_level_ci(arrays["control"], 1000, minus=arrays["single"]),
                     "distilled - single": two_level_ci(arrays["distilled"], 1000, minus=arrays["single"])}}
    Path(args.json).write_text(json.dumps(result, indent=1, default=float))
    print(json.dumps(result, indent=1, default=float))


if __name__ == "__main__":
    main()
