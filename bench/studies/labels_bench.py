"""Label recipes on several labelled benchmarks (issue 59): each recipe x 3 seeds against scikit-learn's tuned
logistic regression, and the recipe `cli train-head` chooses on each benchmark's dev split.

Benchmarks (bench/studies/labels_tables.py builds them offline): `20ng-topic6` (a 20 Newsgroups sample,
`topic6:newsgroup` labels), `20ng-skewed` (the same posts, class sizes 120 down to 4), `trec-qc` (TREC
question classification, `COARSE:fine`, 51 fine classes, when --trec gives its files), `20ng-full` (all of 20
Newsgroups, `body`, its `a.b.c` newsgroup labels; when `--work`/store-20ng exists). Rows, on test:
- `tuned LR (reference)`: scikit-learn's LogisticRegressionCV (C in {0.1, 1, 10, 100} by stratified 5-fold CV)
  on the stored features of every train text, what `cli train-head` prints as the reference;
- `tuned probe`: headstore's probe (C and scaling chosen on dev, one-standard-error rule; train less dev);
- `ce`, `ce-tree`, `supcon-knn`: the recipes of heads.training.label_recipes, trained on train less dev (the
  tree with the labels read under their separator);
- `default`: per seed, the recipe `choose` picks on dev (what train-head trains), its test accuracy (the
  reference's when `lr` wins: train-head refits it on every train text).
Each: mean ± std over seeds [95% t-interval], a 95% bootstrap interval over test texts, and minus the reference
with the paired bootstrap interval; `coarse`: the accuracy of the predicted class's top level.

    python bench/studies/labels_tables.py  # (imported; labels_bench builds the tables itself)
    nice -n 10 python bench/studies/labels_bench.py --work /work/scratch/labels --trec /work/scratch/labels/trec \
        --json bench/results/labels-bench-zen4-2026-11-29.json
The stores (featurized once, reused; a benchmark without its store is skipped, said): `--work`/store-20ng128
(MiniLM, 128 tokens), `--work`/store-trec and `--work`/store-20ng (all of 20 Newsgroups at 256 tokens):
    cli featurize --model minilm --data $D/20newsgroups --format labels --text-column body \
        --label-columns level1,level2,label --max-length 256 --store WORK/store-20ng
The JSON keeps each recipe's per-text dev correctness per seed (`dev_correct`), so a choice rule can be re-read.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from labels_heads import machine  # noqa: E402
from labels_tables import build  # noqa: E402

from headstore.featurize.store.reader import FeatureStore  # noqa: E402
from headstore.heads.evaluation.evaluate import embedder  # noqa: E402
from headstore.heads.experiments.compare.datasets_root import datasets_root  # noqa: E402
from headstore.heads.experiments.grid.summary import mean_std_ci  # noqa: E402
from headstore.heads.kinds import kind_of, load_task  # noqa: E402
from headstore.heads.kinds.label_eval import class_scores, probe_choices, ranking_metrics  # noqa: E402
from headstore.heads.network.features import load_features  # noqa: E402
from headstore.heads.scoring.energy import pairwise_energy  # noqa: E402
from headstore.heads.scoring.losses import CLASSES  # noqa: E402
from headstore.heads.scoring.metrics import bootstrap_ci  # noqa: E402
from headstore.heads.settings.config import KIND_DEPENDENT, HeadConfig, TrainConfig  # noqa: E402
from headstore.heads.training.kind_defaults import head_shape  # noqa: E402
from headstore.heads.training.label_recipes import (  # noqa: E402
    RECIPES, REFERENCE, applies, choose, recipe_configs, reference_lr)
from headstore.heads.training.train import train_one  # noqa: E402

STORES = {"20ng-topic6": "store-20ng128", "20ng-skewed": "store-20ng128", "trec-qc": "store-trec",
          "20ng-full": "store-20ng"}
FORMATS = {"20ng-full": "labels?text_column=body"}  # the others: `text,label,split` tables


def predictions(task, split: str, embed, energy: str) -> np.ndarray:
    """(n,) predicted classes of a split's texts: a classifier head's argmax, an energy head's k-NN vote."""
    data, ref = task.eval_sets[split], task.reference
    zq = embed(data.rows, "query")[0]
    if energy == CLASSES:
        return class_scores(zq.float(), task.leaf_nodes, [len(n) for n in task.node_names]).argmax(-1).cpu().numpy()
    zr = embed(ref.rows, "document")[0]
    return ranking_metrics(pairwise_energy(energy, zq, zr), data.classes, ref.classes, len(task.class_names),
                           full=False)["knn"]


def scored(task, pred: np.ndarray, split: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """(correct, coarse correct) per text: the class, and its top-level node (the fine class when flat)."""
    y = task.eval_sets[split].classes
    coarse = task.coarse_of if task.coarse_of is not None else np.arange(len(task.class_names))
    known = y >= 0
    return (pred == y).astype(np.float64), (known & (coarse[pred] == coarse[np.where(known, y, 0)])).astype(np.float64)


def recipe_run(task, X, name: str, seed: int) -> dict:
    """One recipe, one seed, trained on train less dev: per-text dev correctness, test correctness and coarse."""
    unset = KIND_DEPENDENT
    head_cfg, cfg = recipe_configs(task, HeadConfig(), TrainConfig(seed=seed), unset, RECIPES[name])
    trained = kind_of(task).for_training(task, cfg)
    shape = head_shape(head_cfg, X, "features", trained, cfg)
    t0 = time.perf_counter()
    model, norm, _ = train_one(trained, X, shape, cfg, progress=False)
    embed = embedder(model, X, norm)
    dev, _ = scored(trained, predictions(trained, "dev", embed, cfg.eval_energy), "dev")
    test, coarse = scored(trained, predictions(trained, "test", embed, cfg.eval_energy))
    return {"dev": dev, "test": test, "coarse": coarse, "seconds": time.perf_counter() - t0}


def row(name: str, test: np.ndarray, coarse: np.ndarray, ref: np.ndarray, note: str = "") -> dict:
    """(S, n) per-text correctness over S seeds against the reference's (n,)."""
    lo, hi = bootstrap_ci(test)
    d_lo, d_hi = bootstrap_ci(test, minus=ref)
    return {"method": name, "accuracy": mean_std_ci(test.mean(1)), "ci_texts": [lo, hi],
            "coarse": float(coarse.mean()), "minus_lr": float(test.mean() - ref.mean()), "minus_ci": [d_lo, d_hi],
            "note": note}


def benchmark(name: str, path: Path, store: FeatureStore, seeds: list[int]) -> tuple[list[dict], dict]:
    """(its rows, per recipe and seed the per-text dev correctness as a '0101...' string)."""
    X = load_features(store)
    fmt = FORMATS.get(name, "labels")
    flat = load_task(str(path), store, fmt)
    tree = load_task(str(path), store, fmt + ("&" if "?" in fmt else "?") + "label_sep=auto")
    ref_block, ref = reference_lr(flat, X)
    ref_coarse = np.full_like(ref, ref_block.get("test_accuracy_coarse", np.nan))
    rows = [row("tuned LR (reference)", ref[None], ref_coarse[None], ref, f"C = {ref_block['C']:g}")]
    probe, choice = probe_choices(flat, embedder(None, X))[0]
    test = flat.eval_sets["test"]
    pred = probe.predict(X[test.rows].double().numpy())
    rows.append(row("tuned probe (dev, 1-SE)", *(v[None] for v in scored(flat, pred)), ref,
                    f"C = {choice.C:g}, {choice.scaling}"))
    runs = {}
    for recipe in ("lr", "ce", "ce-tree", "supcon-knn"):
        task = tree if recipe == "ce-tree" else flat
        if recipe != "ce-tree" and not applies(RECIPES[recipe], task) or recipe == "ce-tree" and not tree.hierarchical:
            continue
        lbfgs = RECIPES[recipe].settings.get("solver") == "lbfgs"  # one fit (the first seed's CV folds) for all seeds
        runs[recipe] = [recipe_run(task, X, recipe, s) for s in (seeds[:1] if lbfgs else seeds)] * (
            len(seeds) if lbfgs else 1)
        print(f"{name}: {recipe} done ({sum(r['seconds'] for r in runs[recipe]):.0f} s)", flush=True)
        if recipe != REFERENCE:
            rows.append(row(recipe, np.array([r["test"] for r in runs[recipe]]),
                            np.array([r["coarse"] for r in runs[recipe]]), ref,
                            f"dev {np.mean([r['dev'].mean() for r in runs[recipe]]):.4f}"))
    rows += default_rows(runs, ref, ref_coarse, len(seeds))
    return rows, {k: ["".join(str(int(v)) for v in r["dev"]) for r in runs[k]] for k in runs}


def default_rows(runs: dict, ref: np.ndarray, ref_coarse: np.ndarray, n_seeds: int) -> list[dict]:
    """The default per seed, `choose` over the labels read flat (as a user runs it) and with the tree a candidate:
    the chosen recipe's test correctness (the reference's when `lr` wins: train-head refits it on every train
    text)."""
    rows = []
    for label, among in (("default (chosen on dev)", [k for k in runs if k != "ce-tree"]),
                         ("default, --label-sep auto (tree a candidate)", list(runs))):
        if label.startswith("default, ") and "ce-tree" not in runs:
            continue
        choices = [choose({k: runs[k][i]["dev"] for k in among}) for i in range(n_seeds)]
        chosen = [c for c, _ in choices]
        test = [ref if c == REFERENCE else runs[c][i]["test"] for i, c in enumerate(chosen)]
        coarse = [ref_coarse if c == REFERENCE else runs[c][i]["coarse"] for i, c in enumerate(chosen)]
        rows.append({**row(label, np.array(test), np.array(coarse), ref, "chose " + ", ".join(chosen)),
                     "dev_choice": [c for _, c in choices]})
    return rows


def table_lines(name: str, rows: list[dict]) -> list[str]:
    lines = [f"### {name}", "", "| method | seeds | test accuracy | CI (texts) | coarse | minus tuned LR [CI] | note |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        a = r["accuracy"]
        lines.append(f"| {r['method']} | {a['n']} | {a['mean']:.4f} ± {a['std']:.4f} [{a['ci_lo']:.4f}, "
                     f"{a['ci_hi']:.4f}] | [{r['ci_texts'][0]:.4f}, {r['ci_texts'][1]:.4f}] | {r['coarse']:.4f} | "
                     f"{r['minus_lr']:+.4f} [{r['minus_ci'][0]:+.4f}, {r['minus_ci'][1]:+.4f}] | {r['note']} |")
    return lines + [""]


def matrix_lines(tables: dict) -> list[str]:
    """Benchmarks x recipes: mean test accuracy over seeds [95% t-interval]; the default's minus the reference
    with its paired bootstrap interval (docs/labels.md's opening table)."""
    methods = [r["method"] for r in next(iter(tables.values()))["rows"]]
    methods += [m for t in tables.values() for m in (r["method"] for r in t["rows"]) if m not in methods]
    lines = ["| benchmark | " + " | ".join(methods) + " | default − tuned LR [CI] |",
             "|---|" + "---|" * (len(methods) + 1)]
    for name, t in tables.items():
        by = {r["method"]: r for r in t["rows"]}
        cells = []
        for m in methods:
            a = by[m]["accuracy"] if m in by else None
            cells.append("–" if a is None else f"{a['mean']:.4f}" + (f" [{a['ci_lo']:.4f}, {a['ci_hi']:.4f}]"
                                                                      if a["n"] > 1 else ""))
        d = by["default (chosen on dev)"]  # the default as a user runs it (labels read flat)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {d['minus_lr']:+.4f} [{d['minus_ci'][0]:+.4f}, "
                     f"{d['minus_ci'][1]:+.4f}] |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="folder of the tables (tables/) and the stores")
    parser.add_argument("--trec", default=None, help="folder with TREC's train_5500.label and TREC_10.label")
    parser.add_argument("--only", default="", help="comma-separated benchmarks (default: all built)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)  # a shared, loaded CPU: one thread each thrashes less (state the load beside figures)
    work, seeds = Path(args.work), [int(s) for s in args.seeds.split(",")]
    newsgroups = datasets_root() / "20newsgroups" / "20newsgroups.parquet"
    paths = {**build(work / "tables", newsgroups, Path(args.trec) if args.trec else None), "20ng-full": newsgroups}
    out_path = Path(args.json)
    out = json.loads(out_path.read_text()) if out_path.exists() else {"tables": {}}
    out.update({"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seeds": seeds})
    for name, path in paths.items():
        if args.only and name not in args.only.split(","):
            continue
        if not (work / STORES[name]).exists():
            print(f"{name} skipped: no store {work / STORES[name]} (featurize it first: the module doc)")
            continue
        t0 = time.perf_counter()
        rows, dev = benchmark(name, path, FeatureStore.open(work / STORES[name]), seeds)
        out["tables"][name] = {"rows": rows, "seconds": time.perf_counter() - t0, "table": str(path),
                               "dev_correct": dev}
        print("\n".join(table_lines(name, rows)), flush=True)
        out_path.write_text(json.dumps(out, indent=1, default=float))
    print("\n".join(matrix_lines(out["tables"])))


if __name__ == "__main__":
    main()
