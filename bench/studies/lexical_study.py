"""The lexical channel on SciFact and out of domain: BM25 fused with the frozen features, the head and its memory.

For each seed, `cli train-head` on SciFact with its defaults (the lexical channel and the memory fitted on dev, as
shipped) writes DIR/seed-S (a folder holding a metrics.json is kept). Every system is then scored again on the test
claims from the head folder alone (heads.training.lexical_fit.split_items, the code `cli eval` runs), per claim, so
the table has two-level bootstrap CIs over seeds and claims (heads.scoring.bootstrap), split into seen and unseen
claims (a relevant abstract judged in the head's training, heads.kinds.seen). Out of domain (Cranfield, CACM) the
SciFact head is scored at its weight for a new corpus (`weight_new`, chosen on dev's unseen claims); the memory has
nothing to act on there. The systems:

- frozen: the frozen features, cosine; bm25: BM25 alone; frozen+bm25: the two fused at the frozen features' own dev
  weight (the fair baseline: the same channel, no head);
- head, head+memory (the memory as fitted), head+memory+bm25 (as train-head ships it: BM25's weight and the memory's
  gain chosen on dev).

    python3 bench/studies/lexical_study.py --store STORE --work DIR --json OUT.json [--seeds 0,1,2]
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))

from headstore.featurize.store.reader import FeatureStore  # noqa: E402
from headstore.heads.artefacts.task_features import TaskFeatures  # noqa: E402
from headstore.heads.experiments.compare.datasets_root import datasets_root  # noqa: E402
from headstore.heads.kinds import load_task  # noqa: E402
from headstore.heads.kinds.fused_rank import fused_ndcg, lexical_scores  # noqa: E402
from headstore.heads.scoring.bootstrap import two_level_ci  # noqa: E402
from headstore.heads.settings.config import TrainConfig  # noqa: E402
from headstore.heads.training.eval_run import eval_seen, judged_in_corpus  # noqa: E402
from headstore.heads.training.lexical_fit import applied_weight, load as load_lexical, split_index, split_items  # noqa: E402
from headstore.heads.training.memory_use import load_for_eval  # noqa: E402
from headstore.heads.training.run import load_head  # noqa: E402
from limits import machine, machine_line  # noqa: E402

SYSTEMS = ("frozen", "bm25", "frozen+bm25", "head", "head+memory", "head+memory+bm25")


def train(store: str, data: str, out: Path, seed: int) -> None:
    if (out / "metrics.json").is_file():
        return
    subprocess.run(["cli", "train-head", "--store", store, "--data", data, "--out", str(out), "--seed", str(seed),
                    "--overwrite"], check=True, stdout=subprocess.DEVNULL)


def scored(store_path: str, head_dir: Path, data: str) -> tuple[dict, np.ndarray]:
    """({system: per-query nDCG@10 on test}, the seen mask) of one head on one dataset."""
    store = FeatureStore.open(store_path)
    model, norm, config = load_head(str(head_dir))
    task = load_task(data, store, for_eval=True)
    seen, _, judged_rows = eval_seen(str(head_dir), config, store, task, "test")
    judged = judged_in_corpus(judged_rows, task, "test")
    tf = TaskFeatures.for_task(store, task)
    placed, _ = load_for_eval(str(head_dir), store, task, tf, "auto")
    task, features = tf.remap(task), tf.read("features")
    energy, saved = TrainConfig.from_dict(config["train"]).eval_energy, load_lexical(str(head_dir), "on")
    cfg, gain, w0 = saved["bm25"], saved["gain"], saved["frozen_weight"]
    w = applied_weight(saved, judged)  # weight_new on a corpus none of whose documents the training judged
    data_split = task.eval_sets["test"]
    bm25 = fused_ndcg(data_split, torch.zeros(len(data_split.query_ids), len(data_split.doc_ids)),
                      lexical_scores(data_split, cfg, task.name), 1.0, "cosine")[1]
    index = split_index(task, "test", cfg)
    out = {**split_items(task, "test", features, None, None, None, "cosine",
                         {"frozen": (0.0, 1.0), "frozen+bm25": (w0, 1.0)}, cfg, index), "bm25": bm25,
           **split_items(task, "test", features, model, norm, None, energy, {"head": (0.0, 1.0)}, cfg, index),
           **split_items(task, "test", features, model, norm, placed, energy,
                         {"head+memory": (0.0, 1.0), "head+memory+bm25": (w, gain)}, cfg, index)}
    return out, np.asarray(seen.get("test", np.zeros(len(out["frozen"]), bool)), dtype=bool)


def cell(values: np.ndarray, reference: np.ndarray, mask: np.ndarray) -> dict:
    """Mean over seeds and queries in `mask`, and minus the reference with a two-level 95% CI."""
    v, r = values[:, mask], reference[:, mask]
    if not mask.any():
        return {"n": 0}
    lo, hi = two_level_ci(v, minus=r)
    return {"n": int(mask.sum()), "value": float(v.mean()), "minus": float((v - r).mean()), "ci": [lo, hi]}


def table(per_seed: list[dict], mask: np.ndarray, reference: str) -> dict:
    stack = {s: np.stack([p[s] for p in per_seed]) for s in SYSTEMS}  # (S, Q)
    parts = {"seen": mask, "unseen": ~mask, "all": np.ones_like(mask)}
    return {s: {p: cell(stack[s], stack[reference], m) for p, m in parts.items()} for s in SYSTEMS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--seeds", default="0,1,2")
    args = ap.parse_args()
    root, work = datasets_root(), Path(args.work)
    seeds = [int(s) for s in args.seeds.split(",")]
    for s in seeds:
        train(args.store, str(root / "scifact"), work / f"seed-{s}", s)
    result = {}
    for name in ("scifact", "cranfield", "cacm"):
        runs = [scored(args.store, work / f"seed-{s}", str(root / name)) for s in seeds]
        mask = runs[0][1]
        result[name] = {"frozen": table([r[0] for r in runs], mask, "frozen"),
                        "frozen+bm25": table([r[0] for r in runs], mask, "frozen+bm25")}
    m = machine()
    print(machine_line(m))
    for name, t in result.items():
        print(f"\n{name} test nDCG@10, mean of seeds {seeds}; minus frozen [95% CI]")
        for s in SYSTEMS:
            print(f"  {s:18s}" + "".join(
                f"  {p} {c['value']:.4f} ({c['minus']:+.4f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}])"
                for p, c in t["frozen"][s].items() if c["n"]))
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "machine": m,
           "store": args.store, "seeds": seeds, "lexical": {s: json.loads((work / f"seed-{s}" / "lexical.json")
                                                                         .read_text()) for s in seeds},
           "tables": result}
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
