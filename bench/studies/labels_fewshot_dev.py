"""Choosing the few-shot heads' schedule on dev, never on test.

Few-shot heads have no dev split to stop on, so their settings are fixed before the test run. This script
picks them on the dev slice of 20 Newsgroups' train split (held out of the texts the shots are drawn from):
- energy heads (default): every loss x epochs x lr through `cli grid`, 16 texts per class, seeds 0-2,
  scored on dev beside the frozen probe and k-NN on the same shots;
- `--classifier`: the `ce` classifier head's few-shot variants (`VARIANTS`: epochs, depth, width, dropout)
  at each of `--shots`, seeds 0-2, its argmax accuracy on dev beside the tuned probe (C by CV on the
  shots, heads.kinds.label_probe) and LogisticRegression() (C = 1, L2) fitted on the same shots.
It prints the summary and writes JSON.

    python bench/studies/labels_fewshot_dev.py --store runs/store-20ng --json runs/labels-fewshot-dev.json
    python bench/studies/labels_fewshot_dev.py --store runs/store-20ng --classifier --shots 8,16,64 \
        --json bench/results/labels_fewshot_ce_dev.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from headstore.heads.experiments.grid.run import run_grid  # noqa: E402
from headstore.heads.experiments.grid.summary import summarize, summary_table  # noqa: E402
from headstore.heads.kinds.labels import SUMMARY_METRICS  # noqa: E402
from headstore.heads.experiments.compare.datasets_root import datasets_root  # noqa: E402

GRID = """[grid]
loss = {losses}
epochs = [3, 10, 20]
lr = [1e-4, 1e-3]
shots = [{shots}]
seed = [0, 1, 2]
[fixed]
batch_size = 64
"""
# the classifier head's few-shot candidates: (name, train settings, head settings) over the full-data
# recipe (ce, standardised input, lr 3e-3, depth 2, hidden 1024, 10 epochs)
VARIANTS = (("full-data recipe (10 epochs)", {}, {}),
            ("100 epochs", {"epochs": 100}, {}),
            ("100 epochs, depth 1", {"epochs": 100}, {"depth": 1}),
            ("100 epochs, dropout 0.5", {"epochs": 100}, {"dropout": 0.5}),
            ("100 epochs, l2 input", {"epochs": 100, "normalize": "l2"}, {}),
            ("300 epochs", {"epochs": 300}, {}),
            ("100 epochs, depth 1, l2 input", {"epochs": 100, "normalize": "l2"}, {"depth": 1}),
            ("100 epochs, weight decay 0.1", {"epochs": 100, "weight_decay": 0.1}, {}),
            ("100 epochs, depth 1, l2 input, lr 1e-2", {"epochs": 100, "normalize": "l2", "lr": 1e-2}, {"depth": 1}),
            ("100 epochs, depth 1, l2 input, lr 3e-2", {"epochs": 100, "normalize": "l2", "lr": 3e-2}, {"depth": 1}),
            ("300 epochs, depth 1, l2 input", {"epochs": 300, "normalize": "l2"}, {"depth": 1}),
            ("100 epochs, dropout 0.5, l2 input", {"epochs": 100, "normalize": "l2"}, {"dropout": 0.5}),
            ("100 epochs, depth 1, l2 input, no smoothing", {"epochs": 100, "normalize": "l2", "label_smoothing": 0.0},
             {"depth": 1}),
            ("few_shot_epochs(n)", {"epochs": "auto"}, {}),
            ("few_shot_epochs(n), depth 1, l2 input", {"epochs": "auto", "normalize": "l2"}, {"depth": 1}),
            ("lbfgs, l2 input (the tuned probe's fit as a head)", {"solver": "lbfgs", "normalize": "l2"}, {"depth": 1}),
            ("lbfgs + self-train 3 x 64", {"solver": "lbfgs", "normalize": "l2", "self_train": 3}, {"depth": 1}),
            ("lbfgs + self-train 5 x 32", {"solver": "lbfgs", "normalize": "l2", "self_train": 5,
                                           "self_train_add": 32}, {"depth": 1}),
            ("lbfgs + self-train 5 x 64", {"solver": "lbfgs", "normalize": "l2", "self_train": 5}, {"depth": 1}),
            ("lbfgs + self-train 8 x 64", {"solver": "lbfgs", "normalize": "l2", "self_train": 8}, {"depth": 1}),
            ("lbfgs + self-train 5 x 128", {"solver": "lbfgs", "normalize": "l2", "self_train": 5,
                                            "self_train_add": 128}, {"depth": 1}),
            ("lbfgs, standardised input + self-train 5 x 64",
             {"solver": "lbfgs", "normalize": "standardize", "self_train": 5}, {"depth": 1}),
            ("lbfgs + self-train 5 x 64, rounds at C = 10",
             {"solver": "lbfgs", "normalize": "l2", "self_train": 5, "self_train_c": 10.0}, {"depth": 1}),
            ("lbfgs + self-train 5 x 64, rounds at C = 100",
             {"solver": "lbfgs", "normalize": "l2", "self_train": 5, "self_train_c": 100.0}, {"depth": 1}))
# "auto" epochs: heads.kinds.labels.few_shot_epochs(shots), the default's rule


def energy_grid(args) -> dict:
    out = Path(args.out or tempfile.mkdtemp(prefix="labels-dev-"))
    grid = out / "dev-grid.toml"
    out.mkdir(parents=True, exist_ok=True)
    grid.write_text(GRID.format(losses=json.dumps(args.losses.split(",")), shots=args.shots))
    frame = run_grid(args.store, args.data, str(grid), str(out), args.format, progress=False, score_split="dev")
    summary = summarize(frame, SUMMARY_METRICS)
    print(summary_table(summary))
    return {"split": "dev", "shots": args.shots, "summary": summary.to_dicts()}


def classifier_dev(task, X, shots: int, seed: int, train: dict, head: dict) -> float:
    """Dev accuracy of one ce head trained on `shots` texts per class drawn with `seed`."""
    from headstore.heads.evaluation.evaluate import embedder, evaluate_split
    from headstore.heads.kinds import for_training
    from headstore.heads.settings.config import HeadConfig, TrainConfig
    from headstore.heads.training.run import head_shape
    from headstore.heads.training.train import train_stack
    from headstore.heads.kinds.labels import few_shot_epochs
    if train.get("epochs") == "auto":
        train = {**train, "epochs": few_shot_epochs(shots)}
    cfg = TrainConfig(**{"loss": "ce", "normalize": "standardize", "lr": 3e-3, "epochs": 10, "shots": shots,
                         "seed": seed, **train})
    stask = for_training(task, cfg)
    shape = head_shape(HeadConfig(**{"depth": 2, "hidden": 1024, **head}), X, "features", stask, cfg)
    model, norm, _ = train_stack(stask, X, shape, [cfg], progress=False)
    dtask = dataclasses.replace(stask, eval_sets={"dev": task.eval_sets["dev"]})
    res, _ = evaluate_split(dtask, "dev", embedder(model, X, norm), ("classes",))
    return float(res[0]["classifier_accuracy"])


def probes_dev(task, X, shots: int, seed: int) -> dict[str, float]:
    """Dev accuracy of the tuned probe (CV on the shots) and of LogisticRegression() (C = 1, L2) on them."""
    from headstore.heads.kinds import for_training
    from headstore.heads.kinds.label_probe import plain_probe, tuned_probe
    from headstore.heads.settings.config import TrainConfig
    ref, dev = for_training(task, TrainConfig(shots=shots, seed=seed)).reference, task.eval_sets["dev"]
    x, dx = X[ref.rows].numpy(), X[dev.rows].numpy()
    tuned, choice = tuned_probe(x, ref.classes, seed=seed)
    plain = plain_probe(1.0, "l2", seed).fit(x, ref.classes)
    return {"tuned LR (CV on the shots)": float((tuned.predict(dx) == dev.classes).mean()),
            "LogisticRegression() C=1, L2": float((plain.predict(dx) == dev.classes).mean())}


def classifier_study(args) -> dict:
    from headstore.featurize.store.reader import FeatureStore
    from headstore.heads.kinds import load_task
    from headstore.heads.network.features import load_features
    store = FeatureStore.open(args.store)
    task, X = load_task(args.data, store, args.format), load_features(store)
    seeds, rows = [0, 1, 2], []
    for shots in [int(s) for s in str(args.shots).split(",")]:
        scores: dict[str, list[float]] = {}
        for seed in seeds:
            for name, value in probes_dev(task, X, shots, seed).items():
                scores.setdefault(name, []).append(value)
        picked = [VARIANTS[int(i)] for i in args.variants.split(",")] if args.variants else VARIANTS
        for name, train, head in picked:
            t0 = time.perf_counter()
            scores[name] = [classifier_dev(task, X, shots, s, train, head) for s in seeds]
            print(f"{shots} shots, {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        for name, values in scores.items():
            rows.append({"shots": shots, "method": name, "dev": values, "mean": float(np.mean(values))})
            print(f"| {shots} | {name} | {np.mean(values):.4f} | {', '.join(f'{v:.4f}' for v in values)} |",
                  flush=True)
    return {"split": "dev", "seeds": seeds, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--data", default=str(datasets_root() / "20newsgroups"))
    parser.add_argument("--format", default="labels?text_column=body")
    parser.add_argument("--shots", default="16", help="texts per class (--classifier: a comma list)")
    parser.add_argument("--losses", default="supcon-kl,supcon,l1-energy")
    parser.add_argument("--classifier", action="store_true", help="the ce head's few-shot variants (module doc)")
    parser.add_argument("--out", default=None, help="Results folder (default: a temporary one).")
    parser.add_argument("--variants", default="", help="--classifier: the VARIANTS to run, by index (default all)")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    result = classifier_study(args) if args.classifier else energy_grid(args)
    Path(args.json).write_text(json.dumps(result, indent=1, default=float))


if __name__ == "__main__":
    main()
