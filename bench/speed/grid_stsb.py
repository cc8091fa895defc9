"""Benchmark: the main job's STS-B grid (examples/grid.toml: 144 configurations, 120 heads in 10 stacks) with its own
account, against the machine's matmul limit, before and after a change, in one run.

    python bench/speed/grid_stsb.py --store runs/store-minilm --json runs/bench-grid-stsb.json
    python bench/speed/grid_stsb.py --store runs/store-minilm --before /path/to/old.pp --golden runs/grid-stsb \\
        --precisions fp32,bf16 --json runs/bench-grid-stsb.json

Each grid runs as `cli grid` runs it (heads.experiments.grid.run.run_grid, progress off, the command line's process
settings: torch's huge pages and glibc's malloc keeping freed memory, headstore.cli) in a child process
(bench/speed/grid_account.py) on the checkout its PYTHONPATH names: `--before DIR` (a folder holding the old
`headstore`, e.g. a git worktree linked as DIR/headstore) runs the old code beside this checkout's, alternating, so
both see the same machine. The matmul limit (bench/speed/limits.py, featurize's hardware probe: a 2048^3 fp32 and
bf16 matmul) is measured before and after, the best kept. Per grid:

- wall seconds, CPU seconds, the head matmuls (training forward + backward, dev scoring, final scoring) and the
  training steps' rate (their matmul FLOPs over the seconds of forward + loss and backward) as a share of the
  limit at the grid's precision; the plan's modelled seconds beside the measured ones;
- the wall time's shares: training steps (forward + loss, backward + clipping, optimizer), dev scoring, warm-up
  (each stack's first step beyond its median step), data movement (batches, negatives, a stack's set-up), final
  scoring, writing, Python / other;
- the roofline of the training steps: their matmuls at the matmul limit plus what they must stream at the memory
  limit (limits.memory_limit: AdamW's fp32 state, and bf16 autocast's casts), and the highest share of the matmul
  limit the steps could reach with nothing else in them;
- per stack: steps, seconds, first and median step; the GEMM shapes (H, m, k, n) of the training steps;
- with `--golden DIR` (a grid folder of the same grid, e.g. the main job's): every configuration's dev figure
  against it (max |difference|, rows matched by their settings) and whether the
  leaderboard's best configuration is the same.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import limits  # noqa: E402
import polars as pl  # noqa: E402

SETTINGS = ["loss", "depth", "lr", "weight_decay", "seed"]
STEP_PARTS = ["forward + loss", "backward + clipping", "optimizer"]
MOVE_PARTS = ["batches", "negatives", "stack set-up"]
SHARES = ["training steps", "dev scoring", "warm-up (first steps)", "data movement", "final scoring",
          "baseline", "read inputs", "write results", "leaderboard, summary, plots", "Python / other"]


def grid_file(grid: str, precision: str, work: Path) -> str:
    """The grid file, with `precision` fixed (fp32: the file itself, as the main job runs it)."""
    if precision == "fp32":
        return grid
    text = Path(grid).read_text().replace("[fixed]\n", f'[fixed]\nprecision = "{precision}"\n', 1)
    path = work / f"grid-{precision}.toml"
    path.write_text(text)
    return str(path)


def run_child(pp: str, label: str, precision: str, args, work: Path) -> dict:
    out, account = work / f"{label}-{precision}", work / f"{label}-{precision}.json"
    env = {"THP_MEM_ALLOC_ENABLE": "1", **os.environ, "PYTHONPATH": pp}  # as `cli grid` (headstore.cli), unless set
    load = os.getloadavg()[0]
    if account.exists() and args.resume:  # measured by an earlier call (a long bench under load, interrupted)
        return {"load_before": None, "load_after": None, **json.loads(account.read_text()), "label": label,
                "precision": precision, "out": str(out)}
    cmd = [sys.executable, str(HERE / "grid_account.py"), "--store", args.store, "--data", args.data,
           "--grid", grid_file(args.grid, precision, work), "--out", str(out), "--account", str(account)]
    subprocess.run(cmd, env=env, check=True, cwd=work)
    acc = json.loads(account.read_text())
    acc.update(label=label, precision=precision, load_before=load, load_after=os.getloadavg()[0], out=str(out))
    account.write_text(json.dumps(acc, indent=1))  # with its load, for --resume
    return acc


def shares(acc: dict) -> dict[str, float]:
    """Wall seconds per share (SHARES): the timed parts grouped; warm-up taken out of the steps."""
    s = acc["seconds"]
    warm = sum(max(0.0, st["first_step_s"] - st["median_step_s"]) for st in acc["stacks"])
    out = {"training steps": sum(s.get(p, 0.0) for p in STEP_PARTS) - warm, "dev scoring": s.get("dev scoring", 0.0),
           "warm-up (first steps)": warm, "data movement": sum(s.get(p, 0.0) for p in MOVE_PARTS)}
    out.update({k: s.get(k, 0.0) for k in SHARES if k not in out and k != "Python / other"})
    out["Python / other"] = acc["wall_s"] - sum(out.values())
    return out


def roofline(train_flops: float, stream_bytes: float, limit: dict, precision: str) -> dict:
    """The training steps' floor: their matmuls at the matmul limit plus what they must stream at the memory
    limit (AdamW's fp32 weights, gradients and moments, 28 B a parameter a step; under bf16 autocast each weight's
    cast and its gradient's, 12 B more), one after the other; the highest share of the matmul limit the steps
    could then reach."""
    matmul_s, memory_s = train_flops / 1e9 / limit[precision], stream_bytes / 1e9 / limit["memory"]
    return {"floor_matmul_s": matmul_s, "floor_memory_s": memory_s,
            "share_bound": matmul_s / max(matmul_s + memory_s, 1e-9)}


def summary(acc: dict, limit: dict) -> dict:
    f, s = acc["flops"], acc["seconds"]
    train = f.get("forward + loss", 0.0) + f.get("backward", 0.0)
    matmul_s = s.get("forward + loss", 0.0) + s.get("backward + clipping", 0.0)
    step_s = sum(s.get(p, 0.0) for p in STEP_PARTS)
    bound = roofline(train, f.get("optimizer bytes", 0.0) + f.get("cast bytes", 0.0), limit, acc["precision"]) \
        if "memory" in limit else {}
    return {**bound, "cast_gb": f.get("cast bytes", 0.0) / 1e9, "train_gflop": train / 1e9, "dev_gflop": f.get("dev scoring", 0.0) / 1e9,
            "final_gflop": f.get("final scoring", 0.0) / 1e9, "optimizer_gflop": f.get("optimizer (elementwise)", 0) / 1e9,
            "optimizer_gb": f.get("optimizer bytes", 0.0) / 1e9,
            "rate_fwd_bwd": train / max(matmul_s, 1e-9) / 1e9, "rate_steps": train / max(step_s, 1e-9) / 1e9,
            "share_fwd_bwd": train / max(matmul_s, 1e-9) / 1e9 / limit[acc["precision"]],
            "share_steps": train / max(step_s, 1e-9) / 1e9 / limit[acc["precision"]],
            "modelled_s": sum(acc["modelled_s"]), "trained_s": sum(st["seconds"] for st in acc["stacks"])}


def golden_check(acc: dict, golden: str) -> dict:
    """Every configuration's dev figure against the golden grid's, and the best configuration of each."""
    new, old = (pl.read_parquet(Path(d) / "results.parquet").filter(pl.col("status") == "ok")
                for d in (acc["out"], golden))
    both = new.join(old, on=SETTINGS, suffix="_golden")  # ids name the data path and the precision: settings
    diff = (both["dev_primary"] - both["dev_primary_golden"]).abs().fill_nan(None).drop_nulls()
    best = [pl.read_csv(Path(d) / "configs.csv").row(0, named=True) for d in (acc["out"], golden)]
    key = [k for k in SETTINGS[:-1] if k in best[0]]
    return {"matched": both.height, "of": new.height, "max_abs_dev_diff": float(diff.max() or 0.0) if len(diff) else None,
            "mean_abs_dev_diff": float(diff.mean()) if len(diff) else None, "best": {k: best[0][k] for k in key},
            "best_golden": {k: best[1][k] for k in key}, "same_best": all(best[0][k] == best[1][k] for k in key)}


def print_tables(runs: list[dict], limit: dict, machine: dict) -> None:
    print("\n" + limits.machine_line(machine))
    print("matmul limit (best of the probes before/after): " + ", ".join(
        f"{p} {v:,.0f} GFLOP/s" for p, v in limit.items() if p != "memory")
          + (f"; memory {limit['memory']:.0f} GB/s (a 256 MB copy)" if "memory" in limit else ""))
    print("\n| run | precision | wall | CPU s | load | train matmuls | dev scoring | rate fwd+bwd | of limit | rate of "
          "the steps | of limit | plan's model | stacks measured |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        m = r["summary"]
        load = "?" if r["load_before"] is None else f"{r['load_before']:.1f}"
        print(f"| {r['label']} | {r['precision']} | {r['wall_s']:.1f} s | {r['cpu_s']:.0f} | {load} | "
              f"{m['train_gflop']:,.0f} GFLOP | {m['dev_gflop']:,.0f} GFLOP | {m['rate_fwd_bwd']:,.0f} GFLOP/s | "
              f"{m['share_fwd_bwd']:.0%} | {m['rate_steps']:,.0f} GFLOP/s | {m['share_steps']:.0%} | "
              f"{m['modelled_s']:.0f} s | {m['trained_s']:.0f} s |")
    bounded = [r for r in runs if "share_bound" in r["summary"]]
    if bounded:
        print("\n| run | precision | matmuls at the limit | streamed (AdamW + casts) | at the memory limit | floor | "
              "rate of the steps at best | measured |\n|---|---|---|---|---|---|---|---|")
    for r in bounded:
        m = r["summary"]
        print(f"| {r['label']} | {r['precision']} | {m['floor_matmul_s']:.1f} s | {m['optimizer_gb'] + m['cast_gb']:,.0f} GB | "
              f"{m['floor_memory_s']:.1f} s | {m['floor_matmul_s'] + m['floor_memory_s']:.1f} s | "
              f"{m['share_bound']:.0%} of the limit | {m['share_steps']:.0%} |")
    print("\n| share of wall | " + " | ".join(f"{r['label']} {r['precision']}" for r in runs) + " |")
    print("|---|" + "---|" * len(runs))
    for part in SHARES:
        print(f"| {part} | " + " | ".join(f"{r['shares'][part]:.1f} s ({r['shares'][part] / r['wall_s']:.0%})"
                                          for r in runs) + " |")
    last = runs[-1]
    print(f"\nstacks ({last['label']}, {last['precision']}):\n\n| loss | depth | heads | steps | seconds | first step | "
          "median step | plan's model |\n|---|---|---|---|---|---|---|---|")
    for st, mod in zip(last["stacks"], last["modelled_s"] or [float("nan")] * len(last["stacks"])):
        print(f"| {st['loss']} | {st['depth']} | {st['heads']} | {st['steps']} | {st['seconds']:.1f} | "
              f"{st['first_step_s'] * 1e3:.0f} ms | {st['median_step_s'] * 1e3:.0f} ms | {mod:.1f} |")
    print("\nGEMMs of the training steps (H x (m x k) @ (k x n)), by count:\n\n| GEMM | H | m | k | n | count |\n"
          "|---|---|---|---|---|---|")
    for g in [g for g in last["gemms"] if g[0].startswith(("forward", "backward"))][:12]:
        print("| " + " | ".join(f"{v:,}" if isinstance(v, int) else str(v) for v in g) + " |")
    checked = [r for r in runs if "golden" in r]
    if checked:
        print("\n| run | precision | configurations matched | max abs dev difference | best configuration | same as "
              "the golden's |\n|---|---|---|---|---|---|")
        for r in checked:
            g = r["golden"]
            print(f"| {r['label']} | {r['precision']} | {g['matched']} of {g['of']} | {g['max_abs_dev_diff']:.2e} | "
                  f"{g['best']} | {g['same_best']} |")


def main() -> None:
    from headstore.heads.experiments.compare.datasets_root import datasets_root

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True, help="a MiniLM feature store holding STS-B (the main job's)")
    ap.add_argument("--data", default=str(datasets_root() / "stsb"))
    ap.add_argument("--grid", default=str(HERE.parents[1] / "examples" / "grid.toml"))
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--before", default=None, help="a PYTHONPATH folder holding the old headstore, run beside")
    ap.add_argument("--golden", default=None, help="a grid folder of the same grid to compare dev figures with")
    ap.add_argument("--before-precisions", default=None, help="the old code's precisions (default: --precisions)")
    ap.add_argument("--work", default=None, help="where the grids are written (default: a temporary folder)")
    ap.add_argument("--resume", action="store_true", help="reuse the accounts --work holds (their loads unknown)")
    ap.add_argument("--json", default=None, help="where the JSON goes (default: WORK/grid-stsb-account.json)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="grid-stsb-"))
    work.mkdir(parents=True, exist_ok=True)
    here_pp = str(Path(__import__("headstore").__file__).parents[1])
    trees = ([("before", args.before)] if args.before else []) + [("after", here_pp)]
    probes = [limits.probe() | {"memory": round(limits.memory_limit(), 1)}]
    runs = []
    before = (args.before_precisions or args.precisions).split(",")
    for precision in args.precisions.split(","):
        for label, pp in trees:
            if label == "after" or precision in before:
                runs.append(run_child(pp, label, precision, args, work))
                print(f"  {label} {precision}: {runs[-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)
    probes.append(limits.probe() | {"memory": round(limits.memory_limit(), 1)})
    limit = limits.best_of(*probes)
    for r in runs:
        r.update(summary=summary(r, limit), shares=shares(r))
        if args.golden:
            r["golden"] = golden_check(r, args.golden)
    machine = limits.machine()
    print_tables(runs, limit, machine)
    path = Path(args.json or work / "grid-stsb-account.json")  # always written: the tables' every figure
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine, "probes": probes, "limit": limit, "runs": runs,
                                "command": " ".join(sys.argv)}, indent=1, default=str))
    print(f"\nJSON: {path}")


if __name__ == "__main__":
    main()
