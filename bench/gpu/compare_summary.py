"""The short summary that ends bench/gpu/compare.sh: per table, whether it finished, its wall time (this call
and summed over the calls that built it), compare.json's time split, the in-domain table and the chosen
learning rates; the card's mean utilisation where nvidia-smi was sampled.

    python bench/gpu/compare_summary.py RUNS OUT TABLE...

Reads RUNS/<table>/compare.json, RUNS/<table>.seconds, RUNS/<table>[.<family>].log, RUNS/smi.csv and
OUT/stages.tsv, env.log (what bench/gpu/compare.sh wrote).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


GOAL_S = 480  # issue 37: both tables in <= 8 minutes of GPU time


def stages(out: Path) -> dict[str, tuple[str, int]]:
    """{stage: (exit code or "skipped", seconds)} of this call."""
    rows = {}
    path = out / "stages.tsv"
    for line in path.read_text().splitlines() if path.is_file() else []:
        name, rc, seconds, *_ = line.split("\t")
        rows[name] = (rc, int(seconds))
    return rows


def seconds_over_calls(runs: Path, name: str) -> list[int]:
    path = runs / f"{name}.seconds"
    return [int(x) for x in path.read_text().split()] if path.is_file() else []


def split_line(split: dict) -> str:
    total = sum(split.values())
    parts = ", ".join(f"{part} {s:.0f} s ({100 * s / total:.0f}%)" for part, s in
                      sorted(split.items(), key=lambda kv: -kv[1]))
    return f"time split (compare.json time_split_seconds, every step as it ran): {total:.0f} s = {parts}"


def in_domain_table(result: dict) -> list[str]:
    rows = result["rows"]
    ind = next(iter(rows[0]["datasets"]))
    lines = [f"| setup | seeds | {ind} (in domain): metric, mean ± std [95% CI] | Δ vs frozen + head [95% CI] | "
             "trainable | s |", "|---|---|---|---|---|---|"]
    for r in rows:
        b = r["datasets"][ind]
        d = b.get("vs_frozen_head")
        diff = "(reference)" if d is None else \
            f"{d['diff']:+.4f} [{d['ci'][0]:+.4f}, {d['ci'][1]:+.4f}]{' *' if d['excludes_zero'] else ''}"
        lines.append(f"| {r['label']} | {len(r['seeds'])} | {b['metric']} {b['mean']:.4f} ± {b['std']:.4f} "
                     f"[{b['ci'][0]:.4f}, {b['ci'][1]:.4f}] | {diff} | {r['trainable_parameters']:,} | "
                     f"{r['seconds']:.0f} |")
    return lines


def tuning_line(result: dict) -> str:
    chosen = []
    for name, per_seed in result.get("tunings", {}).items():
        runs = list(per_seed.values())
        epochs = ", ".join(str(r.get("epochs_run")) for r in runs)
        chosen.append(f"{name} lr {runs[0]['encoder_lr']:g} (epochs run per seed: {epochs})")
    return "tuning: " + "; ".join(chosen) if chosen else ""


def utilisation(runs: Path) -> str:
    path = runs / "smi.csv"
    if not path.is_file():
        return ""
    util = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[1].endswith("%"):
            util.append(float(parts[1].rstrip(" %")))
    if not util:
        return ""
    return f"card utilisation (nvidia-smi every 2 s, all calls): mean {sum(util) / len(util):.0f}%, " \
           f"{len(util)} samples"


def table(runs: Path, name: str, stage: tuple[str, int] | None) -> list[str]:
    rc, seconds = stage or ("not run", 0)
    calls = seconds_over_calls(runs, name)
    done = rc == "0"
    lines = [f"## {name}: {'finished' if done else f'NOT finished (exit {rc}): the same command continues it'}",
             f"wall time: {seconds} s this call; {sum(calls)} s over {len(calls)} call(s) {calls}",
             f"steps finished: {len(list((runs / name).glob('*/step.json')))}"]
    path = runs / name / "compare.json"
    if path.is_file():
        result = json.loads(path.read_text())
        if not done:
            lines.append("(compare.json below: the last report written, a split phase's or an earlier call's)")
        lines += [split_line(result["time_split_seconds"]), "", *in_domain_table(result), "", tuning_line(result)]
    if not done:  # the table's log and each split process's (RUNS/<table>.<family>.log)
        for log in [runs / f"{name}.log", *sorted(runs.glob(f"{name}.*.log"))]:
            tail = log.read_text(errors="replace").splitlines()[-8:] if log.is_file() else []
            lines += [f"{log.name} tail:", *[f"    {x[-200:]}" for x in tail]]
    return lines


def main(argv: list[str]) -> int:
    runs, out, names = Path(argv[0]), Path(argv[1]), argv[2:]
    env = (out / "env.log").read_text().splitlines() if (out / "env.log").is_file() else []
    print(f"# gpu_compare summary\n{' | '.join(env[:3])}")
    st = stages(out)
    if "smoke" in st:
        print(f"smoke test (tests/heads/test_compare_device.py): exit {st['smoke'][0]}, {st['smoke'][1]} s")
    calls = seconds_over_calls(runs, "tables")
    if calls:
        done = all(st.get(n, ("",))[0] == "0" for n in names)
        print(f"both tables: {st.get('tables', ('', 0))[1]} s of wall time this call, {sum(calls)} s over "
              f"{len(calls)} call(s) {calls}; " + (f"goal <= {GOAL_S} s: {'met' if sum(calls) <= GOAL_S else 'NOT met'}"
                                                   if done else "not finished"))
    for name in names:
        print("\n" + "\n".join(table(runs, name, st.get(name))))
    note = utilisation(runs)
    if note:
        print("\n" + note)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
