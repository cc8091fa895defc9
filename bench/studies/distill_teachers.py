"""Which teacher has a real dev gain over the best single head (issue 42 part 2, docs/distill.md)? Ensembles of
heads that already exist, scored on the task's dev split (SciFact: 81 train queries held out by text, the grid's;
STS-B: its dev pairs) and on test (recorded, never chosen on), each against the best single head: the grid's
rank-1 configuration's head of the same seed (a cross-seed teacher: each seed's, the gain averaged over seeds).

Candidates: each seed's `GRID#ensemble=K` (K = 2 .. the grid's configurations), the cross-seed ensembles of the
top-K configurations' heads of every seed (K = 1: the rank-1 configuration's seeds 0-2), and with --extra HEAD
(repeatable: train-head folders over the same store) the whole grid with them. Each gain's 95% CI is the paired
two-level bootstrap of heads.scoring.bootstrap over the split's items and the seeds, of the task's own statistic
(IR: the mean of per-query nDCG@10; STS: Spearman recomputed on each resample of pairs). The teacher to distil is
the one of the largest dev gain averaged over the seeds (the 3-seed study's unit); test is never chosen on.

    python3 bench/studies/distill_teachers.py --store S --grid WORK/grid-scifact --data DATA/scifact \\
        --extra RUNS/head-base-s0/head
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))

from limits import machine, machine_line  # noqa: E402

from headstore.featurize.store.reader import FeatureStore  # noqa: E402
from headstore.heads.artefacts.files import ensemble_ids, load_grid_head, read_results  # noqa: E402
from headstore.heads.artefacts.head import EnsembleHead, Head  # noqa: E402
from headstore.heads.artefacts.task_features import TaskFeatures  # noqa: E402
from headstore.heads.evaluation.evaluate import evaluate_baseline, evaluate_head  # noqa: E402
from headstore.heads.kinds import kind_of, load_task  # noqa: E402
from headstore.heads.scoring.bootstrap import two_level_ci  # noqa: E402

SPLITS = ("dev", "test")


def candidates(grid: Path, seeds: list[int], extra: list[str]) -> dict[str, list[tuple[int | None, list[str]]]]:
    """name -> [(seed or None for cross-seed, member refs)]: the module doc's teachers (and the singles)."""
    n_configs = read_results(grid)["seed"].len() // len(seeds)
    ref = lambda i: f"{grid}#id={i}"  # noqa: E731
    out = {"single (rank 1)": [(s, [ref(ensemble_ids(grid, 1, s)[0])]) for s in seeds]}
    for k in range(2, n_configs + 1):
        out[f"top-{k}, one seed"] = [(s, [ref(i) for i in ensemble_ids(grid, k, s)]) for s in seeds]
    for k in range(1, n_configs + 1):
        out[f"top-{k} x {len(seeds)} seeds"] = [(None, [ref(ensemble_ids(grid, k, s)[j]) for j in range(k)
                                                       for s in seeds])]
    if extra:
        out[f"all {n_configs} x {len(seeds)} + {len(extra)} extra"] = [(None, out[f"top-{n_configs} x {len(seeds)} seeds"]
                                                                        [0][1] + extra)]
    return out


def load(refs: list[str]) -> Head:
    if len(refs) == 1:
        return Head.load(refs[0])
    members = [Head(*load_grid_head(r.split("#id=")[0], id=r.split("#id=")[1]), r) if "#id=" in r else Head.load(r)
               for r in refs]
    return EnsembleHead(members, {"members": refs}, f"{len(refs)} heads")


def score(head: Head, task, features, dim: int, baseline: dict) -> dict:
    """{split: (primary, per-query values)} of one head (features: the raw stored ones, untouched)."""
    items: dict = {}
    m = evaluate_head(task, features, head.model, head.normalizer, head.energy_name, SPLITS, dim=dim,
                      baseline=baseline, items=items)
    return {"dev": (m["dev"]["head"][m["primary"]], np.asarray(items["dev"]["head"])),
            "test": (m["head"][m["primary"]], np.asarray(items["test"]["head"]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--grid", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--extra", action="append", default=[], help="A head folder over the same store.")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    m = machine()
    print(machine_line(m))
    seeds = [int(s) for s in args.seeds.split(",")]
    store = FeatureStore.open(args.store)
    task = load_task(args.data, store)
    tf = TaskFeatures.for_task(store, task)
    task, features = tf.remap(task), tf.read("features")
    baseline = evaluate_baseline(task, features, SPLITS, dim=store.dim)
    scored, rows = {}, []
    for name, entries in candidates(Path(args.grid), seeds, args.extra).items():
        for seed, refs in entries:
            scored[name, seed] = score(load(refs), task, features, store.dim, baseline)
            rows.append(row(name, seed, refs, scored, seeds, gold_of(task)))
            r = rows[-1]
            print(f"{name:28s} seed {seed}: dev {r['dev']:.4f} test {r['test']:.4f} dev gain {r['dev_gain']:+.4f} "
                  f"{[round(x, 4) for x in r['dev_gain_ci']]} test gain {r['test_gain']:+.4f} "
                  f"{[round(x, 4) for x in r['test_gain_ci']]}", flush=True)
    means = by_teacher(rows, scored, seeds, gold_of(task))
    best = max((r for r in means if r["k"] > 1), key=lambda r: r["dev_gain"])
    for r in means:
        print(f"{r['teacher']:28s} mean over seeds: dev {r['dev']:.4f} gain {r['dev_gain']:+.4f} "
              f"{[round(x, 4) for x in r['dev_gain_ci']]}, test {r['test']:.4f} gain {r['test_gain']:+.4f} "
              f"{[round(x, 4) for x in r['test_gain_ci']]}")
    print(f"largest dev gain over seeds: {best['teacher']} ({best['dev_gain']:+.4f})")
    date = datetime.date.today().isoformat()
    path = Path(args.json or Path(__file__).resolve().parents[1] / "results" / f"distill-teachers-zen4-{date}.json")
    path.write_text(json.dumps({"date": date, "machine": m, "store": args.store, "grid": args.grid,
                                "split_note": task.dev_note, "rows": rows, "by_teacher": means,
                                "largest_dev_gain": best["teacher"]}, indent=1))
    print(f"written: {path}")


def by_teacher(rows: list[dict], scored: dict, seeds: list[int], gold: dict) -> list[dict]:
    """One row per teacher: its figures and gains averaged over the student seeds (a one-seed ensemble: its seed's
    teacher against its seed's single head; a cross-seed one: the one teacher against each seed's single head) -
    the unit of the 3-seed study, so the teacher is chosen on these. Each gain's CI is the two-level bootstrap over
    those seeds (as pairs) and the split's items."""
    out = []
    for name in dict.fromkeys(r["teacher"] for r in rows):
        rs = [r for r in rows if r["teacher"] == name]
        out.append({"teacher": name, "k": rs[0]["k"], "seeds": [r["seed"] for r in rs],
                    **{key: float(np.mean([r[key] for r in rs])) for key in ("dev", "test", "dev_gain", "test_gain")}})
        pairs = [(scored[name, r["seed"]], scored["single (rank 1)", s])
                 for r in rs for s in ([r["seed"]] if r["seed"] is not None else seeds)]
        for split in SPLITS:
            values = np.stack([t[split][1] for t, _ in pairs])
            minus = np.stack([single[split][1] for _, single in pairs])
            out[-1][f"{split}_gain_ci"] = list(two_level_ci(values, minus=minus, **gold[split]))
    return out


def gold_of(task) -> dict:
    """{split: keyword arguments of two_level_ci} for the task's primary metric: the per-item mean (IR: per-query
    nDCG@10), or a rank statistic of the per-item scores against the gold (STS: Spearman, pairs: AUC), whose
    resamples must recompute it from the drawn items (a mean of per-pair scores is no Spearman)."""
    statistic = kind_of(task).statistic
    if statistic == "mean":
        return {split: {} for split in SPLITS}
    return {split: {"statistic": statistic, "gold": np.asarray(task.eval_sets[split].labels, dtype=np.float64)}
            for split in SPLITS}


def row(name: str, seed: int | None, refs: list[str], scored: dict, seeds: list[int], gold: dict) -> dict:
    """The table's row: the teacher's dev and test, its gain over the single head of its seed(s) on dev and on
    test, each with the paired two-level bootstrap CI of the task's statistic (gold: `gold_of`)."""
    singles = [scored["single (rank 1)", s] for s in ([seed] if seed is not None else seeds)]
    t = scored[name, seed]
    out = {"teacher": name, "seed": seed, "k": len(refs), "members": refs}
    for split in SPLITS:
        ref = float(np.mean([s[split][0] for s in singles]))
        out |= {split: float(t[split][0]), f"single_{split}": ref, f"{split}_gain": float(t[split][0]) - ref}
    for split in SPLITS:
        minus = np.stack([s[split][1] for s in singles])
        out[f"{split}_gain_ci"] = list(two_level_ci(np.broadcast_to(t[split][1], minus.shape), minus=minus,
                                                    **gold[split]))
    return out


if __name__ == "__main__":
    main()
