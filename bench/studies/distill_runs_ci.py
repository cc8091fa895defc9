"""Seeds of `cli distill` runs into one row with two-level 95% CIs (STS tables): the student's share of the
teacher's test gain over the single head, as distill_study.py reports it, for runs made with `cli distill` itself
(options distill_study.py does not pass, e.g. --array of several layers).

Each run folder's config.json names its store, arrays, data, teacher and single head ("distill"); the per-pair
values (-energy of each test pair) of the student, the single head and the teacher are recomputed from the stores
(a tuned-encoder teacher from its own store), then bootstrapped as distill_study.py does (seeds and pairs).

    python3 bench/studies/distill_runs_ci.py --runs 'WORK/layers-emb-d3-s*' --single WORK/single-layers-s0 \\
        --teacher-store WORK/store-stsb-tuned-s0 --json OUT.json
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
from headstore.heads.experiments.distill_tuned import TunedTeacherStore, tuned_head_dir  # noqa: E402
from headstore.heads.kinds import load_task  # noqa: E402
from headstore.heads.scoring.bootstrap import two_level_ci  # noqa: E402


def pair_values(head: Head, read, pairs) -> np.ndarray:
    """(n,) -E of each pair: the per-item values an STS split's Spearman reads."""
    return -np.abs(head.embed(read(pairs.anchor)) - head.embed(read(pairs.positive))).sum(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", required=True, help="A glob of `cli distill` output folders, one per seed.")
    parser.add_argument("--single", required=True, help="The single head beside (over the runs' store).")
    parser.add_argument("--teacher-store", default=None, help="A tuned-encoder teacher's store.")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    runs = sorted(glob.glob(args.runs))
    config = json.loads((Path(runs[0]) / "config.json").read_text())
    store = FeatureStore.open(config["store"])
    task = load_task(config["data"], store)
    test = task.eval_sets["test"]
    arrays = config["array"].split("+")

    def stored(rows, names=arrays):
        return np.hstack([np.asarray(store.features(rows, a), np.float32) for a in names])

    teacher = Head.load(tuned_head_dir(config["distill"]["teacher"]) or config["distill"]["teacher"])
    tuned = TunedTeacherStore(teacher, store, args.teacher_store) if tuned_head_dir(config["distill"]["teacher"]) else None
    read_teacher = (lambda r: tuned.read(np.asarray(r), teacher.array).numpy()) if tuned else (
        lambda r: stored(r, [teacher.array]))
    single = Head.load(args.single)
    items = {"gold": np.asarray(test.labels, np.float64),
             "single": pair_values(single, lambda r: stored(r, [single.array]), test)[None],
             "teacher": pair_values(teacher, read_teacher, test)[None],
             "distilled": np.stack([pair_values(Head.load(r), stored, test) for r in runs])}
    S = len(runs)
    for c in ("single", "teacher"):
        items[c] = np.repeat(items[c], S, axis=0)  # one head beside every seed
    plain = {c: [float(spearmanr(v, items["gold"]).statistic) for v in items[c]] for c in ("single", "teacher", "distilled")}
    row = {"runs": runs, "test": {c: float(np.mean(v)) for c, v in plain.items()},
           "test_per_seed": plain, "ci": {c: two_level_ci(items[c], N_BOOT, 0, gold=items["gold"], statistic="spearman")
                                          for c in ("single", "teacher", "distilled")},
           "distilled_minus_single_ci": two_level_ci(items["distilled"], N_BOOT, 0, gold=items["gold"],
                                                     statistic="spearman", minus=items["single"]),
           "share": (np.mean(plain["distilled"]) - np.mean(plain["single"])) / (np.mean(plain["teacher"]) -
                                                                                 np.mean(plain["single"])),
           "share_ci": share_ci(items, "spearman")}
    print(json.dumps({k: v for k, v in row.items() if k != "runs"}, indent=1, default=float))
    Path(args.json).write_text(json.dumps(row, indent=1, default=float))


if __name__ == "__main__":
    main()
