"""Seeds of `cli distill` runs into one row with two-level 95% CIs (STS tables): the student's share of the
teacher's test gain over the single head, as distill_study.py reports it, for runs made with `cli distill` itself
(options distill_study.py does not pass, e.g. --array of several layers).

Each run folder's config.json names its store, arrays, data, teacher and single head ("distill"); the per-pair
values (-energy of each test pair) of the student, the single head and the teacher are recomputed from the stores
(a tuned-encoder teacher from its own store), then bootstrapped as distill_study.py does (seeds and pairs).

    python3 bench/studies/distill_runs_ci.py --runs 'WORK/layers-emb-d3-s*' --single WORK/single-layers-s0 \\
        --teacher-store WORK/store-stsb-tuned-s0 --json OUT.json
    # one teacher per run (each run's config names its own), their stores in the runs' sorted order (here t0, t1,
    # t2: links to the runs of teacher seeds 0, 1, 2):
    python3 bench/studies/distill_runs_ci.py --runs 'WORK/per-teacher-adapters/t*' --single WORK/single-layers-s0 \\
        --teacher-store WORK/store-stsb-adapters-s0 --teacher-store WORK/store-stsb-adapters-s1 \\
        --teacher-store WORK/store-stsb-adapters-s2 --json OUT.json
"""
from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from distill_study import N_BOOT, share_ci  # noqa: E402
from headstore.featurize.store.reader import FeatureStore  # noqa: E402
from headstore.heads.artefacts.head import Head  # noqa: E402
from headstore.heads.experiments.distill.tuned import TunedTeacherStore, tuned_head_dir  # noqa: E402
from headstore.heads.kinds import load_task  # noqa: E402
from headstore.heads.scoring.bootstrap import two_level_ci  # noqa: E402


def pair_values(head: Head, read, pairs) -> np.ndarray:
    """(n,) -E of each pair: the per-item values an STS split's Spearman reads."""
    return -np.abs(head.embed(read(pairs.anchor)) - head.embed(read(pairs.positive))).sum(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", required=True, help="A glob of `cli distill` output folders, one per seed.")
    parser.add_argument("--single", required=True, help="The single head beside (over the runs' store).")
    parser.add_argument("--teacher-store", action="append", default=None,
                        help="A tuned-encoder teacher's store: once for every run, or once per run (in the runs' "
                             "sorted order) where each run has its own teacher (e.g. one per tuning seed).")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    runs = sorted(glob.glob(args.runs))
    if not runs:
        parser.error(f"--runs {args.runs!r} matches no folder")
    configs = [json.loads((Path(r) / "config.json").read_text()) for r in runs]
    config = configs[0]
    for r, c in zip(runs, configs):
        if (c["store"], c["data"], c["array"]) != (config["store"], config["data"], config["array"]):
            parser.error(f"{r}: another store, dataset or arrays than {runs[0]}: the runs are not seeds of one row")
    teacher_stores = args.teacher_store or [None]
    if len(teacher_stores) not in (1, len(runs)):
        parser.error(f"--teacher-store given {len(teacher_stores)} times for {len(runs)} runs: once, or once per run")
    teacher_stores = teacher_stores * len(runs) if len(teacher_stores) == 1 else teacher_stores
    store = FeatureStore.open(config["store"])
    task = load_task(config["data"], store)
    test = task.eval_sets["test"]
    arrays = config["array"].split("+")

    def stored(rows, names=arrays):
        return np.hstack([np.asarray(store.features(rows, a), np.float32) for a in names])

    teacher_values = {}  # (teacher, its store) -> (n,) values: a teacher shared by several runs is scored once
    for c, teacher_store in zip(configs, teacher_stores):
        ref = c["distill"]["teacher"]
        if (ref, teacher_store) not in teacher_values:
            teacher = Head.load(tuned_head_dir(ref) or ref)
            tuned = TunedTeacherStore(teacher, store, teacher_store) if tuned_head_dir(ref) else None
            read_teacher = (lambda r, t=tuned, h=teacher: t.read(np.asarray(r), h.array).numpy()) if tuned else (
                lambda r, h=teacher: stored(r, [h.array]))
            teacher_values[ref, teacher_store] = pair_values(teacher, read_teacher, test)
    single = Head.load(args.single)
    S = len(runs)
    items = {"gold": np.asarray(test.labels, np.float64),
             "single": np.repeat(pair_values(single, lambda r: stored(r, [single.array]), test)[None], S, axis=0),
             "teacher": np.stack([teacher_values[c["distill"]["teacher"], t]
                                  for c, t in zip(configs, teacher_stores)]),
             "distilled": np.stack([pair_values(Head.load(r), stored, test) for r in runs])}  # (S, n) each
    plain = {c: [float(spearmanr(v, items["gold"]).statistic) for v in items[c]] for c in ("single", "teacher", "distilled")}
    row = {"runs": runs, "test": {c: float(np.mean(v)) for c, v in plain.items()},
           "test_per_seed": plain, "ci": {c: two_level_ci(items[c], N_BOOT, 0, gold=items["gold"], statistic="spearman")
                                          for c in ("single", "teacher", "distilled")},
           "distilled_minus_single_ci": two_level_ci(items["distilled"], N_BOOT, 0, gold=items["gold"],
                                                     statistic="spearman", minus=items["single"]),
           "share": (np.mean(plain["distilled"]) - np.mean(plain["single"])) / (np.mean(plain["teacher"]) -
                                                                                 np.mean(plain["single"])),
           "share_ci": share_ci(items, "spearman")}  # {"ci": [lo, hi] or None (gain not resolved), "dropped": ...}
    print(json.dumps({k: v for k, v in row.items() if k != "runs"}, indent=1, default=float))
    Path(args.json).write_text(json.dumps(row, indent=1, default=float))


if __name__ == "__main__":
    main()
