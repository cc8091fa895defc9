"""Benchmark: the default `cli train-head` on an IR set of many judgements per query, before and after a change.

    python bench/speed/train_head_ir.py --work runs/train-head-ir --json runs/train-head-ir.json [--before OLD.pp]

The set (issue 58's shape: a few thousand training queries, ~110 k judgements, a few thousand documents): 4,000
documents in 108 topics of ~37; a topic is 4 words of a 70-word vocabulary; a document holds 2-3 of its topic's words
among 4-9 others, a query 1-2 among 2-5 others. 3,000 train, 300 dev and 500 test queries, each judging every
document of its topic (1): 111 k train judgements, an epoch of 1,735 steps of 64. Featurized once by a random BERT
of MiniLM's width (bench/scale/scale_heads.py's, 1 layer, 16 tokens) into a store under --work.

Each train-head runs with the defaults in its own process (`python -m headstore.cli`), on the checkout its
PYTHONPATH names: `--before DIR` (a folder holding the old `headstore`) first, then this checkout's; wall seconds,
steps run, test nDCG@10 (and the frozen baseline's), and how dev was scored are printed and written as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "bench" / "scale"))

from scale_heads import WORDS, build_model  # noqa: E402  (the random BERT of MiniLM's width)

N_DOCS, N_TOPICS, TOPIC_WORDS = 4_000, 108, 4
SPLITS = {"train": 3_000, "dev": 300, "test": 500}


def build_set(folder: Path) -> Path:
    """The synthetic BEIR folder (written once)."""
    if (folder / "qrels" / "test.tsv").exists():
        return folder
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    topics = [rng.sample(WORDS, TOPIC_WORDS) for _ in range(N_TOPICS)]

    def text(topic: int, own: tuple[int, int], other: tuple[int, int]) -> str:
        words = rng.sample(topics[topic], rng.randint(*own)) + [rng.choice(WORDS) for _ in range(rng.randint(*other))]
        rng.shuffle(words)
        return " ".join(words)

    doc_topic = [i % N_TOPICS for i in range(N_DOCS)]
    with open(folder / "corpus.jsonl", "w") as f:
        for i, t in enumerate(doc_topic):
            f.write(json.dumps({"_id": f"d{i}", "title": "", "text": text(t, (2, 3), (4, 9)) + f" {i}"}) + "\n")
    members = {t: [i for i, dt in enumerate(doc_topic) if dt == t] for t in range(N_TOPICS)}
    j = 0
    with open(folder / "queries.jsonl", "w") as fq:
        for split, n in SPLITS.items():
            lines = ["query-id\tcorpus-id\tscore"]
            for _ in range(n):
                t = rng.randrange(N_TOPICS)
                fq.write(json.dumps({"_id": f"q{j}", "text": "find " + text(t, (1, 2), (2, 5))}) + "\n")
                lines += [f"q{j}\td{i}\t1" for i in members[t]]
                j += 1
            (folder / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return folder


def run_cli(pp: str, args: list[str], log: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one CLI command in its own process on the checkout `pp`."""
    t0, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, "w") as out:
        subprocess.run([sys.executable, "-m", "headstore.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                       env={**os.environ, "PYTHONPATH": pp, "HEADSTORE_PROGRESS": "off"}, check=True)
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - t0, cpu.ru_utime + cpu.ru_stime - cpu0.ru_utime - cpu0.ru_stime


def train_head(pp: str, label: str, store: Path, data: Path, work: Path) -> dict:
    out = work / f"head-{label}"
    load = os.getloadavg()[0]
    wall, cpu = run_cli(pp, ["train-head", "--store", str(store), "--data", str(data), "--out", str(out), "--overwrite"],
                   work / f"head-{label}.log")
    m = json.loads((out / "metrics.json").read_text())
    scoring = m.get("dev_scoring", {})
    last = m["history"][-1] if m["history"] else {}
    return {"label": label, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load_before": round(load, 2),
            "steps_run": scoring.get("steps_run"), "planned_steps": scoring.get("planned_steps"),
            "epochs_run": last.get("epoch"),
            "scorings": len(m["history"]), "dev_scoring": scoring, "best_epoch": m["guard"]["best_epoch"],
            "test_ndcg10": m["head"][m["primary"]], "frozen_test_ndcg10": m["baseline"][m["baseline_primary"]],
            "head_dev": m["guard"].get("head_dev"), "frozen_dev": m["guard"].get("frozen_dev")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, help="the set, its store and the heads are written here")
    ap.add_argument("--before", default=None, help="a PYTHONPATH folder holding the old headstore, run first")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    here_pp = str(Path(__import__("headstore").__file__).parents[1])
    data, store = build_set(work / "ir-set"), work / "store"
    if not (store / "manifest.json").exists():
        run_cli(here_pp, ["featurize", "--model", build_model(work / "model"), "--data", str(data), "--store",
                          str(store)], work / "featurize.log")
    rows = [train_head(pp, label, store, data, work)
            for label, pp in ([("before", args.before)] if args.before else []) + [("after", here_pp)]]
    print("\n| run | wall | CPU s | load | steps run / planned | epochs run | dev scorings | test nDCG@10 | frozen | "
          "dev: head / frozen |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['label']} | {r['wall_s']:.0f} s | {r['cpu_s']:.0f} | {r['load_before']:.1f} | {r['steps_run']} / {r['planned_steps']} "
              f"| {r['epochs_run']} | {r['scorings']} | {r['test_ndcg10']:.4f} | {r['frozen_test_ndcg10']:.4f} | "
              f"{r['head_dev'] or float('nan'):.4f} / {r['frozen_dev'] or float('nan'):.4f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "command": " ".join(sys.argv),
                                               "cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0]
                                               if Path("/proc/cpuinfo").exists() else ""}, indent=1))


if __name__ == "__main__":
    main()
