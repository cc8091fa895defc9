"""Heads on taps (featurize --taps, select-taps) against frozen + head on STS-B, with SemEval out of domain: every
candidate trained by `cli train-head` at each seed, scored on STS-B test and (`cli eval --exclude-overlap`) on
SemEval without STS-B's sentences; 95% two-level CIs (seeds and pairs) and each candidate's difference from
frozen + head, seed by seed. Each run is a folder under --work: a rerun reuses what is finished.

    python3 bench/studies/taps_study.py --store WORK/store-stsb-taps --data ../shared/datasets/stsb \\
        --semeval ../shared/datasets/semeval-sts-2012-2016 --work WORK/study --select WORK/sel-stsb.json \\
        --json bench/results/taps-study-stsb-zen4-DATE.json

The table on the terminal; every figure per seed, the CIs and each training's wall seconds in the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from headstore.featurize.store.reader import FeatureStore  # noqa: E402
from headstore.heads.artefacts.head import Head  # noqa: E402
from headstore.heads.kinds import load_task, task_rows, without_overlap  # noqa: E402
from headstore.heads.scoring.bootstrap import two_level_ci  # noqa: E402

N_BOOT = 1000
WIDE = ["--mix-mode", "concat", "--no-residual", "--normalize", "standardize", "--out-dim", "384"]
# f(x) = features + W [features; taps]: starts at the (standardised) features, as frozen + head starts at its own
RESIDUAL = ["--mix-mode", "concat", "--normalize", "standardize", "--out-dim", "384"]
# key -> (the table's name, the --array: "features", or "select:K" for features + the K best taps of --select,
# train-head options)
CANDIDATES = {
    "frozen-head": ("frozen + head", "features", []),
    "top4-linear": ("taps top-4, linear (concat)", "select:4", WIDE),
    "top2-linear": ("taps top-2, linear (concat)", "select:2", WIDE),
    "top4-linear-wd": ("taps top-4, linear, weight decay 0.1", "select:4", [*WIDE, "--weight-decay", "0.1"]),
    "top2-residual": ("taps top-2, residual on features", "select:2", RESIDUAL),
    "top4-residual": ("taps top-4, residual on features", "select:4", RESIDUAL),
    "top2-residual-wd": ("taps top-2, residual, weight decay 0.1", "select:2", [*RESIDUAL, "--weight-decay", "0.1"]),
    "top2-residual-lowrank": ("taps top-2, residual, low-rank 64 (linear)", "select:2",
                              [*RESIDUAL, "--depth", "2", "--hidden", "64", "--activation", "identity"]),
    "top4-residual-adrop": ("taps top-4, residual, array dropout 0.3", "select:4", [*RESIDUAL, "--array-dropout", "0.3"]),
    "top2-residual-adrop": ("taps top-2, residual, array dropout 0.3", "select:2", [*RESIDUAL, "--array-dropout", "0.3"]),
    "top4-residual-adrop-lr3e-4": ("taps top-4, residual, array dropout 0.3, lr 3e-4", "select:4",
                                   [*RESIDUAL, "--array-dropout", "0.3", "--lr", "3e-4"]),
    "top2-residual-lr3e-4": ("taps top-2, residual, lr 3e-4", "select:2", [*RESIDUAL, "--lr", "3e-4"]),
    "top4-residual-lr3e-4": ("taps top-4, residual, lr 3e-4", "select:4", [*RESIDUAL, "--lr", "3e-4"]),
    "top2-residual-lr1e-4": ("taps top-2, residual, lr 1e-4", "select:2", [*RESIDUAL, "--lr", "1e-4"]),
    "top8-residual-adrop5-lr3e-4": ("taps top-8, residual, array dropout 0.5, lr 3e-4", "select:8",
                                    [*RESIDUAL, "--array-dropout", "0.5", "--lr", "3e-4"]),
    "top4-residual-adrop5-lr3e-4": ("taps top-4, residual, array dropout 0.5, lr 3e-4", "select:4",
                                    [*RESIDUAL, "--array-dropout", "0.5", "--lr", "3e-4"]),
    "top6-residual-adrop-lr3e-4": ("taps top-6, residual, array dropout 0.3, lr 3e-4", "select:6",
                                   [*RESIDUAL, "--array-dropout", "0.3", "--lr", "3e-4"]),
    "top4-residual-adrop-lr1e-4": ("taps top-4, residual, array dropout 0.3, lr 1e-4", "select:4",
                                   [*RESIDUAL, "--array-dropout", "0.3", "--lr", "1e-4"]),
    "top8-residual-adrop5": ("taps top-8, residual, array dropout 0.5", "select:8", [*RESIDUAL, "--array-dropout", "0.5"]),
}


def array_of(spec: str, selection: dict | None) -> str:
    if not spec.startswith("select:"):
        return spec
    k = int(spec.split(":")[1])
    ranked = [t for t in selection["ranking"] if selection["scores"][t] > 0][:k]
    order = list(selection["scores"])  # the store's order, as select-taps writes it
    return "+".join([selection["first"], *sorted(ranked, key=order.index)])


def run_cli(args: list[str], log: Path) -> float:
    """Run `cli ARGS` (niced), its output in `log`; wall seconds."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        done = subprocess.run(["nice", "-n", "10", sys.executable, "-m", "headstore.cli", *args], stdout=f,
                              stderr=subprocess.STDOUT, env=os.environ)
    if done.returncode:
        raise SystemExit(f"cli {' '.join(args)} failed: see {log}")
    return time.perf_counter() - t0


def train_and_eval(a, name: str, array: str, options: list[str], seed: int) -> dict:
    folder = Path(a.work) / f"{name}-s{seed}"
    record = folder / "study.json"
    if record.is_file():
        return json.loads(record.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    timing = folder / "train_seconds.json"  # a finished training is kept when its evaluation must run again
    if not timing.is_file():
        seconds = run_cli(["train-head", "--store", a.store, "--data", a.data, "--array", array, "--seed", str(seed),
                           "--out", str(folder / "head"), "--overwrite", *options], folder / "train.log")
        timing.write_text(json.dumps({"seconds": seconds, "load": os.getloadavg()[0]}))
    seconds = json.loads(timing.read_text())["seconds"]
    run_cli(["eval", "--store", a.store, "--head", str(folder / "head"), "--data", a.semeval, "--exclude-overlap",
             a.data, "--out", str(folder / "semeval"), "--overwrite"], folder / "eval.log")
    metrics = json.loads((folder / "head" / "metrics.json").read_text())
    out = {"name": name, "seed": seed, "array": array, "options": options, "train_seconds": round(seconds, 1),
           "load": json.loads(timing.read_text())["load"], "dev": metrics["dev"]["head"]["spearman_manhattan"],
           "dev_baseline": metrics["dev"]["baseline"]["spearman_cosine"]}
    record.write_text(json.dumps(out, indent=1))
    return out


def pair_values(head: Head, store: FeatureStore, pairs) -> np.ndarray:
    """(n,) -E of each pair (the values an STS split's Spearman reads)."""
    names = head.array.split("+")

    def read(rows):
        return np.hstack([store.features(rows, n) for n in names])
    return -np.abs(head.embed(read(pairs.anchor)) - head.embed(read(pairs.positive))).sum(1)


def scored(a, records: list[dict], store: FeatureStore, sets: dict) -> dict:
    """Per-pair values of every candidate's seeds on each set, (S, n)."""
    values = {}
    for r in records:
        head = Head.load(Path(a.work) / f"{r['name']}-s{r['seed']}" / "head")
        for split, pairs in sets.items():
            values.setdefault((r["name"], split), []).append(pair_values(head, store, pairs))
    return {k: np.stack(v) for k, v in values.items()}


def frozen_values(store: FeatureStore, pairs) -> np.ndarray:
    x = lambda rows: store.features(rows, "features")  # noqa: E731
    a, b = x(pairs.anchor), x(pairs.positive)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def eval_pairs(store: FeatureStore, data: str, semeval: str, splits=("test",)) -> dict:
    """The pairs each split is scored on: `data`'s `splits`, and SemEval's test without the pairs sharing a
    text with `data` (as `cli eval --exclude-overlap`)."""
    sets = {s: load_task(data, store).eval_sets[s] for s in splits}
    ood, _ = without_overlap(load_task(semeval, store, for_eval=True), task_rows(load_task(data, store, for_eval=True)))
    return {**sets, "semeval": ood.eval_sets["test"]}


def summarize(a, records: list[dict]) -> list[dict]:
    store = FeatureStore.open(a.store)
    sets = eval_pairs(store, a.data, a.semeval)
    gold = {s: np.asarray(p.labels, np.float64) for s, p in sets.items()}
    values = scored(a, records, store, sets)
    values.update({("frozen cosine", s): frozen_values(store, p)[None] for s, p in sets.items()})
    names = ["frozen cosine", *dict.fromkeys(r["name"] for r in records)]
    rows = []
    for name in names:
        row = {"name": name, "label": CANDIDATES[name][0] if name in CANDIDATES else name, "seeds": sorted(r["seed"] for r in records if r["name"] == name)}
        mine = [r for r in records if r["name"] == name]
        if mine:
            loop = [json.loads((Path(a.work) / f"{name}-s{r['seed']}" / "head" / "config.json").read_text())
                    ["train_seconds"] for r in mine]  # the training loop alone (train-head's own timing)
            row.update(dev=float(np.mean([r["dev"] for r in mine])), dev_per_seed=[r["dev"] for r in mine],
                       train_seconds=float(np.mean(loop)), train_seconds_per_seed=loop,
                       load=[r["load"] for r in mine], cli_seconds=[r["train_seconds"] for r in mine],
                       array=mine[0]["array"], options=mine[0]["options"])
        for s in sets:
            v = values[name, s]
            row[s] = float(np.mean([spearmanr(x, gold[s]).statistic for x in v]))
            row[f"{s}_per_seed"] = [float(spearmanr(x, gold[s]).statistic) for x in v]
            row[f"{s}_ci"] = two_level_ci(v, N_BOOT, 0, gold=gold[s], statistic="spearman")
            ref = values.get(("frozen-head", s))
            if ref is not None and name != "frozen-head":
                v2 = v if len(v) == len(ref) else np.repeat(v, len(ref), axis=0)
                row[f"{s}_minus_frozen_head_ci"] = two_level_ci(v2, N_BOOT, 0, gold=gold[s], statistic="spearman",
                                                                minus=ref)
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| STS-B Spearman | dev | test (seeds) | test 95% CI | - frozen + head [95% CI] | SemEval | SemEval - "
             "frozen + head [95% CI] | training s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        diff = r.get("test_minus_frozen_head_ci")
        sdiff = r.get("semeval_minus_frozen_head_ci")
        lines.append(f"| {r['label']} | {r.get('dev', float('nan')):.4f} | {r['test']:.4f} "
                     f"({', '.join(f'{x:.4f}' for x in r['test_per_seed'])}) | [{r['test_ci'][0]:.3f}, "
                     f"{r['test_ci'][1]:.3f}] | {f'[{diff[0]:+.4f}, {diff[1]:+.4f}]' if diff else ''} | "
                     f"{r['semeval']:.4f} | {f'[{sdiff[0]:+.4f}, {sdiff[1]:+.4f}]' if sdiff else ''} | "
                     f"{r.get('train_seconds', 0):.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--semeval", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--select", default=None, help="`cli select-taps --out` JSON (for the select:K candidates).")
    parser.add_argument("--candidates", default=",".join(CANDIDATES), help="Comma-separated names of CANDIDATES.")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--existing", action="store_true",
                        help="Only the finished runs of --candidates and --seeds (train nothing): the summary.")
    parser.add_argument("--json", required=True)
    a = parser.parse_args()
    selection = json.loads(Path(a.select).read_text()) if a.select else None
    records = []
    for name in a.candidates.split(","):
        if name not in CANDIDATES:
            parser.error(f"--candidates: {name!r}; valid: {list(CANDIDATES)}")
        _, spec, options = CANDIDATES[name]
        for seed in map(int, a.seeds.split(",")):
            if a.existing and not (Path(a.work) / f"{name}-s{seed}" / "study.json").is_file():
                continue
            records.append(train_and_eval(a, name, array_of(spec, selection), options, seed))
            print(f"{name} s{seed}: dev {records[-1]['dev']:.4f} ({records[-1]['train_seconds']:.0f} s)", flush=True)
    rows = summarize(a, records)
    print(table(rows))
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps({"rows": rows, "records": records, "selection": selection,
                                        "machine": os.uname().nodename}, indent=1, default=float))


if __name__ == "__main__":
    main()
