"""Label heads beside a tuned logistic regression on the frozen features (issue 39): one table per dataset.

What a user with labelled texts and frozen embeddings tries first is a tuned logistic regression
(`LogisticRegressionCV`); headstore's label heads must beat it. On the test split, over seeds:
- full data: the tuned probe on the stored features (C and scaling chosen on dev), the probe before it
  was tuned (C = 1 on L2-normalised features: SetFit's default head), frozen k-NN, the default recipe
  (what `cli train-head` trains on a labels table given no loss: the kind's defaults, a `ce` classifier
  head), `ce --hierarchy` (one softmax per tree level; dev decides between the two), and an energy head
  (`supcon-kl`): its k-NN and the tuned probe on its outputs;
- few-shot (n texts per class, each seed drawing its own): the tuned probe (C by cross-validation on the
  shots), the default recipe, `supcon-kl`'s k-NN and probe, and `LogisticRegression()` on the L2-normalised
  stored features of the shots (SetFit's frozen body + default head, docs/labels.md; `cli setfit-compare`
  runs SetFit itself).
Each cell: mean over seeds ± std [95% t-interval over seeds]; `CI (texts)`: a 95% bootstrap interval over
test texts of the seed-mean accuracy; `minus tuned LR`: the paired difference to the tuned probe on the same
texts, with its bootstrap interval. Seeds of a configuration train as one stack (as `cli grid` does).

    python bench/studies/labels_heads.py --store /work/stores/20ng --shots '' --json bench/results/labels_heads.json
    python bench/studies/labels_heads.py --store /work/stores/20ng --no-full --shots 8,16,64 --update \
        --setfit runs/setfit-20ng/setfit.json --json bench/results/labels_heads.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from headstore.featurize.store.reader import FeatureStore  # noqa: E402
from headstore.heads.evaluation.evaluate import embedder, evaluate_split  # noqa: E402
from headstore.heads.experiments.compare.datasets_root import datasets_root  # noqa: E402
from headstore.heads.experiments.grid.summary import mean_std_ci  # noqa: E402
from headstore.heads.kinds import for_training, kind_of, load_task  # noqa: E402
from headstore.heads.kinds.label_probe import plain_probe  # noqa: E402
from headstore.heads.network.features import load_features  # noqa: E402
from headstore.heads.scoring.metrics import bootstrap_ci  # noqa: E402
from headstore.heads.settings.config import KIND_DEPENDENT, HeadConfig, TrainConfig  # noqa: E402
from headstore.heads.training.run import defaults_for_kind, head_shape  # noqa: E402
from headstore.heads.training.train import train_stack  # noqa: E402


def recipe(task, **given) -> tuple[HeadConfig, TrainConfig]:
    """train-head's configs for `task` with `given` set and every other kind-dependent setting left to the kind."""
    head_keys = set(HeadConfig.__dataclass_fields__)
    head = HeadConfig(**{k: v for k, v in given.items() if k in head_keys})
    train = TrainConfig(**{k: v for k, v in given.items() if k not in head_keys})
    head, train, _ = defaults_for_kind(task, head, train, tuple(k for k in KIND_DEPENDENT if k not in given))
    return head, train


def train_heads(task, X, seeds, **given) -> dict:
    """One stack of len(seeds) heads of the recipe (shots: one stack per seed); {metric prefix: (S, n) items}."""
    head, train = recipe(task, **given)
    configs = [train.replace(seed=s) for s in seeds]
    stacks = [configs] if not train.shots else [[c] for c in configs]
    items, dev, t0 = {}, [], time.perf_counter()
    for stack in stacks:
        stask = for_training(task, stack[0])
        shape = head_shape(head, X, "features", stask, stack[0])
        model, norm, runs = train_stack(stask, X, shape, stack, progress=False)
        scored = kind_of(stask).evaluate_splits(stask, ("test",), embedder(model, X, norm), (train.eval_energy,))
        _, per_head = scored["test"]
        for h, it in enumerate(per_head):
            for key, values in it.items():
                items.setdefault(key, []).append(values)
        dev += [r.best_dev for r in runs]
    return {"items": {k: np.asarray(v, dtype=np.float64) for k, v in items.items()}, "dev": dev,
            "config": {"loss": train.loss, "hierarchy": train.hierarchy, "lr": train.lr, "epochs": train.epochs,
                       "depth": shape.depth, "hidden": shape.hidden, "dropout": shape.dropout,
                       "label_smoothing": train.label_smoothing, "solver": train.solver,
                       "self_train": train.self_train, "self_train_add": train.self_train_add,
                       "self_train_c": train.self_train_c},
            "seconds": time.perf_counter() - t0}


def frozen(task, X, seeds, shots: int) -> dict:
    """The frozen features on the same texts: tuned probe, cosine k-NN, and LogisticRegression() (C = 1, L2)."""
    out: dict = {}
    for seed in seeds if shots else seeds[:1]:
        stask = for_training(task, TrainConfig(shots=shots, seed=seed))
        res, items = evaluate_split(stask, "test", embedder(None, X), ("cosine",))
        ref, test = stask.reference, stask.eval_sets["test"]
        default = plain_probe(1.0, "l2").fit(X[ref.rows].numpy(), ref.classes).predict(X[test.rows].numpy())
        for key, values in (("probe", items[0]["probe"]), ("cosine", items[0]["cosine"]),
                            ("default", (default == test.classes).astype(np.float64))):
            out.setdefault(key, []).append(values)
        out.setdefault("C", []).append(res[0]["probe_C"])
        out.setdefault("standardize", []).append(res[0]["probe_standardize"])
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}


def row(name: str, values: np.ndarray, reference: np.ndarray, note: str = "") -> dict:
    """A table row: (S, n) per-text correctness of S seeds against the tuned probe's (S', n)."""
    acc = mean_std_ci(values.mean(1))
    lo, hi = bootstrap_ci(values)
    d_lo, d_hi = bootstrap_ci(values, minus=reference)
    return {"method": name, "accuracy": acc, "ci_texts": [lo, hi],
            "minus_tuned_lr": float(values.mean() - reference.mean()), "minus_ci": [d_lo, d_hi], "note": note}


def table_lines(rows: list[dict], title: str) -> list[str]:
    lines = [f"### {title}", "", "| method | seeds | test accuracy | CI (texts) | minus tuned LR [CI] | note |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        a = r["accuracy"]
        texts = f"[{r['ci_texts'][0]:.4f}, {r['ci_texts'][1]:.4f}]" if r["ci_texts"] else "–"
        minus = (f"{r['minus_tuned_lr']:+.4f} [{r['minus_ci'][0]:+.4f}, {r['minus_ci'][1]:+.4f}]"
                 if r["minus_ci"] else "–")
        lines.append(f"| {r['method']} | {a['n']} | {a['mean']:.4f} ± {a['std']:.4f} [{a['ci_lo']:.4f}, "
                     f"{a['ci_hi']:.4f}] | {texts} | {minus} | {r['note']} |")
    return lines + [""]


HEADS = ("ce", "hierarchy", "energy", "ce-alone")  # the trained rows: the default recipe, ce --hierarchy,
# supcon-kl, and (few-shot) the default recipe without self-training


def scenario(task, X, seeds, shots: int, heads=HEADS) -> list[dict]:
    base = frozen(task, X, seeds, shots)
    ref = base["probe"]
    how = "CV on the shots" if shots else "on dev"
    chosen = ", ".join(f"C={c:g}{' std' if s else ''}" for c, s in zip(base["C"], base["standardize"]))
    rows = [row("tuned LR, frozen features", ref, ref, f"C chosen {how}: {chosen}"),
            row("LogisticRegression() C=1, L2 (the old probe; = SetFit (a): frozen body + its default head)",
                base["default"], ref),
            row("k-NN cosine, frozen features", base["cosine"], ref)]
    given = {"shots": shots} if shots else {}
    if "ce" in heads:
        ce = train_heads(task, X, seeds, **given)
        rows.append(row("default recipe: ce head (train-head, no --loss)", ce["items"]["classifier"], ref,
                        f"{ce['config']}; dev {np.nanmean(ce['dev']):.4f}; {ce['seconds']:.0f} s"))
    if "ce-alone" in heads and shots:  # the default without its unlabeled texts: what self-training adds
        alone = train_heads(task, X, seeds, self_train=0, **given)
        rows.append(row("ce head without self-training (the shots alone)", alone["items"]["classifier"], ref,
                        f"{alone['config']}; {alone['seconds']:.0f} s"))
    if "hierarchy" in heads and not shots and task.hierarchical:
        tree = train_heads(task, X, seeds, hierarchy=True, **given)
        rows.append(row("ce --hierarchy (one softmax per level)", tree["items"]["classifier"], ref,
                        f"dev {np.nanmean(tree['dev']):.4f}; {tree['seconds']:.0f} s"))
    if "energy" in heads:
        energy = train_heads(task, X, seeds, loss="supcon-kl", **given)
        dev = f"dev {np.nanmean(energy['dev']):.4f}; " if not shots else ""
        rows += [row("supcon-kl head, k-NN (L1)", energy["items"]["manhattan"], ref, f"{dev}{energy['seconds']:.0f} s"),
                 row("supcon-kl head + tuned LR on its outputs", energy["items"]["probe"], ref)]
    return rows


def setfit_rows(path: str, shots: int) -> list[dict]:
    """`cli setfit-compare`'s SetFit rows at `shots` (its setfit.json): accuracy over seeds on its own test
    sample (--test-per-class), no per-text values here, so no paired difference (its own table has the tuned
    LR and the ce head on the same texts)."""
    return [{"method": r["method"], "accuracy": r["accuracy"], "ci_texts": None, "minus_tuned_lr": None,
             "minus_ci": None, "note": f"cli setfit-compare, on its test sample; {r['seconds']:.0f} s a run"}
            for r in json.loads(Path(path).read_text()) if r["shots"] == shots and r["method"].startswith("SetFit")]


def machine() -> str:
    """The CPU this ran on, in lscpu's words."""
    import platform
    import subprocess
    try:
        info = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        name = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        name = platform.processor()
    return f"{name}, {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--data", default=str(datasets_root() / "20newsgroups"))
    parser.add_argument("--format", default="labels?text_column=body&label_columns=level1,level2,label")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--shots", default="8,16,64", help="few-shot texts per class; empty: full data only")
    parser.add_argument("--no-full", action="store_true", help="skip the full-data table")
    parser.add_argument("--setfit", default=None, help="a `cli setfit-compare` setfit.json: its SetFit rows join "
                        "the few-shot tables")
    parser.add_argument("--heads", default=",".join(HEADS), help=f"the trained rows, of {HEADS}")
    parser.add_argument("--update", action="store_true", help="keep the other tables of an existing --json")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    store = FeatureStore.open(args.store)
    task = load_task(args.data, store, args.format)
    X = load_features(store)
    old = json.loads(Path(args.json).read_text()) if args.update and Path(args.json).exists() else {}
    out = {"data": args.data, "format": args.format, "seeds": seeds, "machine": machine(),
           "date": time.strftime("%Y-%m-%d", time.gmtime()), "tables": old.get("tables", {}),
           "seconds_per_table": old.get("seconds_per_table", {})}
    for shots in ([] if args.no_full else [0]) + [int(s) for s in args.shots.split(",") if s]:
        t0 = time.perf_counter()
        rows = scenario(task, X, seeds, shots, tuple(args.heads.split(",")))
        if shots and args.setfit:
            rows += setfit_rows(args.setfit, shots)
        title = f"{task.name}: {'all train texts (dev held out)' if not shots else f'{shots} texts per class'}"
        out["tables"][str(shots)] = rows
        out["seconds_per_table"][str(shots)] = time.perf_counter() - t0
        print("\n".join(table_lines(rows, title)), flush=True)
        Path(args.json).write_text(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
