"""Benchmark: a stacked grid of heads vs the same heads trained one after another.

In one run, on stored MiniLM features:
1. a 64-head grid (2-layer 384->512->256 heads, l1-energy, 4 lr x 4 weight decay x 4 seeds, 5 epochs)
   trained stacked (`heads.train.train_stack`, what `cli grid` runs) vs the same 64 heads trained one
   after another, two ways: with train-head itself (`heads.run.train_head`: what `cli train-head` runs,
   less the interpreter start — store, task and features loaded, head trained, evaluated on test beside
   the baseline, artefacts written, per head), and with only its training loop (`heads.train.train_one`,
   a lower bound: the arithmetic alone) — wall time and ratios;
2. the wall time of that 64-head grid on SciFact train pairs and on STS-B train.

    python bench/grid.py --store runs/store-minilm --json runs/bench-grid.json

`--sequential-heads N` times only N of the sequential heads and extrapolates to 64 (marked as such).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headstore.featurize.store import FeatureStore  # noqa: E402
from headstore.heads.config import TrainConfig  # noqa: E402
from headstore.heads.features import load_features  # noqa: E402
from headstore.heads.model import HeadConfig  # noqa: E402
from headstore.heads.tasks import load_task  # noqa: E402
from headstore.heads.run import train_head  # noqa: E402
from headstore.heads.train import train_one, train_stack  # noqa: E402

DATA = Path(os.environ.get("HEADSTORE_DATA", Path(__file__).resolve().parents[2] / "shared" / "datasets"))


def grid_configs(loss: str) -> list[TrainConfig]:
    base = TrainConfig(loss=loss, epochs=5, patience=5)
    return [dataclasses.replace(base, lr=lr, weight_decay=wd, seed=s)
            for lr in (3e-4, 1e-3, 3e-3, 1e-2) for wd in (0.0, 0.01, 0.05, 0.1) for s in range(4)]


def time_it(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True)
    ap.add_argument("--sequential-heads", type=int, default=64, help="sequential heads to time (extrapolated to 64)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    store = FeatureStore.open(args.store)
    X = load_features(store)
    head = HeadConfig(depth=2, hidden=512, out_dim=256, residual=False, in_dim=X.shape[1])  # the shape
    rows = []
    for name, path, loss in (("SciFact train pairs", DATA / "scifact", "l1-energy"),
                             ("STS-B train", DATA / "stsb", "l1-energy")):
        task = load_task(str(path), store)
        configs = grid_configs(loss)
        stacked = time_it(lambda: train_stack(task, X, head, configs, progress=False))
        n_seq = min(args.sequential_heads, len(configs))
        head_cli = dataclasses.replace(head, in_dim=None)
        with tempfile.TemporaryDirectory() as tmp:
            cli_seq = time_it(lambda: [train_head(args.store, str(path), f"{tmp}/{i}", head_cli, c, progress=False)
                                       for i, c in enumerate(configs[:n_seq])])
        loop_seq = time_it(lambda: [train_one(task, X, head, c, progress=False) for c in configs[:n_seq]])
        scale = len(configs) / n_seq
        rows.append({"dataset": name, "pairs": len(task.train), "heads": len(configs), "stacked_s": stacked,
                     "train_head_s": cli_seq * scale, "loop_s": loop_seq * scale, "sequential_timed_heads": n_seq,
                     "speedup_vs_train_head": cli_seq * scale / stacked, "speedup_vs_loop": loop_seq * scale / stacked,
                     "goal_speedup": 5.0, "goal_stacked_s": 120.0})
    print(f"{'dataset':<22}{'pairs':>7}{'heads':>7}{'stacked s':>11}{'train-head s':>14}{'ratio':>7}"
          f"{'loop only s':>13}{'ratio':>7}  goals")
    for r in rows:
        star = "*" if r["sequential_timed_heads"] < r["heads"] else ""
        print(f"{r['dataset']:<22}{r['pairs']:>7}{r['heads']:>7}{r['stacked_s']:>11.1f}"
              f"{r['train_head_s']:>13.1f}{star}{r['speedup_vs_train_head']:>6.1f}x"
              f"{r['loop_s']:>12.1f}{star}{r['speedup_vs_loop']:>6.1f}x  >=5x, <120 s")
    if any(r["sequential_timed_heads"] < r["heads"] for r in rows):
        print(f"* extrapolated to {rows[0]['heads']} from {rows[0]['sequential_timed_heads']} heads timed one after another")
    print(f"torch threads: {__import__('torch').get_num_threads()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "head": dataclasses.asdict(head)}, indent=2))


if __name__ == "__main__":
    main()
