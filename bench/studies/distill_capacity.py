"""How much of a tuned encoder's teacher a map on the frozen features can hold (issue 42, the tuned teacher).

The tuned teacher's output of a text is f_t(x_t): its head over the tuned encoder's pooled features. A student
reads the frozen encoder's pooled features x instead. Here the best linear map W of x onto f_t(x_t) (ridge least
squares, closed form, fitted on the task's training texts and the unlabeled texts of the student's store) is
measured two ways on the dev and test pairs: how much of the teacher's output variance it explains (R^2: is the
teacher's output predictable from the frozen features?) and the Spearman of -||W x_a - W x_b||_1 against the gold
scores (is what stays unexplained what the ranking reads?), beside the teacher and the frozen + head it is set
against. --arrays: the map reads several of the store's arrays side by side (a store featurized with
--layers: do the other layers' pooled features hold what the last one lacks?). A bound for a linear student, a
probe for any: a student at the teacher's R^2 but the frozen + head's
Spearman is missing the part of the teacher the frozen features do not carry linearly.

    python3 bench/studies/distill_capacity.py --store WORK/store-stsb-mrpc --data ../shared/datasets/stsb \\
        --unlabeled WORK/unlabeled/mrpc-sentences.parquet --teacher COMPARE/finetuned-s0-lr4e-05-KEY \\
        --teacher-store WORK/store-stsb-tuned-s0 --single 'COMPARE/head-base-s0-*/head' --json OUT.json
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))

from headstore.featurize.store.reader import FeatureStore  # noqa: E402
from headstore.heads.artefacts.head import Head  # noqa: E402
from headstore.heads.experiments.distill.tuned import TunedTeacherStore, tuned_head_dir  # noqa: E402
from headstore.heads.kinds import load_task  # noqa: E402
from limits import machine, machine_line  # noqa: E402

RIDGE = (1e-2, 1.0, 10.0)  # the ridge penalties tried: the fit moves little across them (the table shows each)


def l1_spearman(za: np.ndarray, zb: np.ndarray, gold: np.ndarray) -> float:
    """Spearman of -||za - zb||_1 against the gold scores: an STS split's figure for an L1-energy head."""
    return float(spearmanr(-np.abs(za - zb).sum(1), gold).statistic)


def with_bias(x: np.ndarray) -> np.ndarray:
    return np.hstack([x, np.ones((len(x), 1), np.float32)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, help="The student's (frozen) store, holding the unlabeled texts.")
    parser.add_argument("--data", required=True, help="An STS table (its train, dev and test pairs).")
    parser.add_argument("--unlabeled", action="append", default=[])
    parser.add_argument("--teacher", required=True, help="A `cli finetune` output (a tuned encoder and its head).")
    parser.add_argument("--teacher-store", required=True, help="The tuned encoder's store of the same texts.")
    parser.add_argument("--single", required=True, help="Frozen + head over --store (a glob matching one folder).")
    parser.add_argument("--arrays", default="features", help="The store's arrays the map reads, joined by +, e.g. "
                        "features+features_layer-2 (a store featurized with --layers); the head reads `features`.")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    m = machine()
    print(machine_line(m))
    store = FeatureStore.open(args.store)
    task = load_task(args.data, store, unlabeled=tuple(args.unlabeled))
    teacher = Head.load(tuned_head_dir(args.teacher))
    (single_dir,) = glob.glob(args.single)
    single = Head.load(single_dir)
    tuned = TunedTeacherStore(teacher, store, args.teacher_store)

    def frozen(rows):  # the head's input: the store's first array
        return np.asarray(store.features(rows, "features"), np.float32)

    def probed(rows):  # the map's input: --arrays side by side
        return np.hstack([np.asarray(store.features(rows, a), np.float32) for a in args.arrays.split("+")])

    def taught(rows):  # (n, d) the teacher's outputs of the store's rows
        return teacher.embed(tuned.read(np.asarray(rows), teacher.array).numpy())

    train = np.unique(np.concatenate([task.train.anchor, task.train.positive,
                                      *([task.unlabeled.rows] if task.unlabeled is not None else [])]))
    raw = probed(train)
    mean, std = raw.mean(0), raw.std(0) + 1e-6  # each column standardised: arrays of unlike scales, one penalty

    def inputs(rows):
        return with_bias((probed(rows) - mean) / std)

    X, Y = inputs(train), taught(train)
    rows = []
    splits = {s: task.eval_sets[s] for s in ("dev", "test")}
    for name, fn in (("teacher", lambda r: taught(r)), ("frozen + head", lambda r: single.embed(frozen(r)))):
        rows.append({"map": name, **{s: l1_spearman(fn(p.anchor), fn(p.positive), p.labels) for s, p in splits.items()}})
    for lam in RIDGE:
        W = np.linalg.solve(X.T @ X + lam * np.eye(X.shape[1], dtype=np.float32), X.T @ Y)
        row = {"map": f"ridge {lam:g} of {args.arrays}"}
        for s, p in splits.items():
            za, zb = inputs(p.anchor) @ W, inputs(p.positive) @ W
            yt = taught(p.anchor)
            row[s] = l1_spearman(za, zb, p.labels)
            row[f"{s}_r2"] = float(1 - ((za - yt) ** 2).sum() / ((yt - yt.mean(0)) ** 2).sum())
        rows.append(row)
    print(f"fit on {len(train):,} texts")
    report(rows, m, args)


def report(rows: list[dict], m: dict, args) -> None:
    """The table on the terminal, every row in the JSON."""
    print(f"{'map':36}  dev     test    dev R^2  test R^2")
    for r in rows:
        r2 = f"{r['dev_r2']:.3f}    {r['test_r2']:.3f}" if "dev_r2" in r else ""
        print(f"{r['map']:36}  {r['dev']:.4f}  {r['test']:.4f}  {r2}")
    date = datetime.date.today().isoformat()
    path = Path(args.json or Path(__file__).resolve().parents[1] / "results" / f"distill-capacity-{date}.json")
    path.write_text(json.dumps({"date": date, "machine": m, "args": vars(args), "rows": rows}, indent=1))
    print(f"written: {path}")


if __name__ == "__main__":
    main()
