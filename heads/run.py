"""`cli train-head` and `cli eval`: train one head on a dataset's stored features, evaluate, write the artefacts.

Output directory:
- `head.safetensors` (+ `normalizer.safetensors`): the head, loadable by `heads.run.load_head`;
- `config.json`: every setting, the dataset, the store path and fingerprint;
- `metrics.json`: `{"baseline": {...}, "head": {...}}` on the test split, the dev figures under
  `"dev"`, the primary metric's name and bootstrap 95% CIs under `"ci"`;
- `curve.png`: training loss and dev metric per epoch.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict
from pathlib import Path

import torch

from headstore.data.files import atomic_write_json
from headstore.featurize.store import FeatureStore
from headstore.heads.config import TrainConfig
from headstore.heads.evaluate import PREFIX, embed_rows, evaluate_split, primary_metric
from headstore.heads.features import Normalizer, load_features
from headstore.heads.metrics import bootstrap_ci
from headstore.heads.model import HeadConfig, load_heads, save_heads
from headstore.heads.experiments.plots import plot_curve
from headstore.heads.label_tasks import for_training
from headstore.heads.tasks import Task, load_task, task_rows, without_overlap
from headstore.heads.train import train_one

TEST_SPLIT = "test"


def ci_of(task: Task, split: str, items: dict, prefix: str, n_boot: int = 1000) -> list[float]:
    """Bootstrap 95% CI of the primary metric over queries (IR) or pairs (STS/pairs)."""
    values = items[prefix]
    if task.kind in ("ir", "labels"):  # labels: per-text k-NN correctness -> CI of the accuracy
        return list(bootstrap_ci(values, n_boot=n_boot))
    gold = task.eval_sets[split].labels
    stat = "spearman" if task.kind == "sts" else None
    if stat is None:  # pairs: CI of AUC is not in bootstrap_ci; report none rather than a wrong one
        return []
    return list(bootstrap_ci(values, gold=gold, statistic=stat, n_boot=n_boot))


def evaluate_head(task: Task, features: torch.Tensor, model, norm: Normalizer | None, energy: str,
                  splits: tuple[str, ...]) -> dict:
    """metrics.json content for the splits present: baseline and head, with CIs of the primary metric."""
    out: dict = {"primary": primary_metric(task.kind, energy),
                 "baseline_primary": primary_metric(task.kind, "cosine"), "ci": {}}
    energies = (energy,) if energy == "cosine" else (energy, "cosine")
    X = norm(features) if norm is not None else features
    for split in splits:
        if split not in task.eval_sets:
            continue
        base, base_items = evaluate_split(task, split, lambda r: embed_rows(None, features, r), ("cosine", "l1"))
        head, head_items = evaluate_split(task, split, lambda r: embed_rows(model, X, r), energies)
        block = {"baseline": base[0], "head": head[0]}
        ci = {"baseline": ci_of(task, split, base_items[0], "cosine"),
              "head": ci_of(task, split, head_items[0], PREFIX[energy])}
        if split == TEST_SPLIT:
            out.update(block)
            out["ci"] = ci
        else:
            out[split] = block | {"ci": ci}
    return out


def train_head(store_path: str, data_path: str, out_dir: str, head_cfg: HeadConfig, cfg: TrainConfig,
               data_format: str | None = None, array: str = "features", progress: bool = True) -> dict:
    """Train one head on `data_path`'s train split, select on dev, report test once; write `out_dir`."""
    store = FeatureStore.open(store_path)
    task = for_training(load_task(data_path, store, data_format), cfg)  # labelled texts: shots, hierarchy
    features = load_features(store, array)
    head_cfg = HeadConfig(**{**asdict(head_cfg), "in_dim": features.shape[1]})
    model, norm, run = train_one(task, features, head_cfg, cfg, progress)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_heads(out / "head.safetensors", model)
    norm.save(out / "normalizer.safetensors")
    config = {"head": asdict(head_cfg), "train": cfg.to_dict(), "data": str(data_path), "format": data_format,
              "task": task.name, "kind": task.kind, "dev": task.dev_note or "the dataset's dev split",
              "store": str(store_path), "store_fingerprint": store.fingerprint, "array": array,
              "store_manifest": {k: v for k, v in store.manifest.items() if k != "arrays"},
              "best_epoch": run.best_epoch, "train_seconds": run.seconds}
    atomic_write_json(out / "config.json", config, sort_keys=True)
    metrics = evaluate_head(task, features, model, norm, cfg.eval_energy, ("dev", TEST_SPLIT))
    metrics["history"] = run.history
    if getattr(task, "report", None):  # labelled texts: unseen labels, skipped texts, duplicates
        metrics["data_report"] = task.report
    atomic_write_json(out / "metrics.json", metrics, sort_keys=True)
    plot_curve(run.history, out / "curve.png", title=f"{task.name}: {cfg.loss} ({cfg.eval_energy})")
    return metrics


def load_head(head_dir: str):
    """(model, normalizer, config dict) of a head written by train_head."""
    d = Path(head_dir)
    if not (d / "head.safetensors").is_file():
        raise FileNotFoundError(f"{d}: no head.safetensors (is this a `cli train-head --out` directory?)")
    config = json.loads((d / "config.json").read_text())
    norm_path = d / "normalizer.safetensors"
    norm = Normalizer.load(norm_path) if norm_path.is_file() else Normalizer.fit("none", torch.zeros(1, 1))
    return load_heads(d / "head.safetensors"), norm, config


def eval_head(store_path: str, head_dir: str, data_path: str, out_dir: str, data_format: str | None = None,
              exclude_overlap: str | None = None) -> dict:
    """Evaluate a trained head on any dataset whose texts are in the store; write metrics.json.

    `exclude_overlap`: a dataset (e.g. the one the head was trained on) whose texts must not be scored:
    evaluation pairs / queries that use one of its texts are dropped (counted in metrics.json)."""
    store = FeatureStore.open(store_path)
    model, norm, config = load_head(head_dir)
    if config["store_manifest"].get("dim") not in (None, store.dim):
        raise ValueError(f"{head_dir} was trained on {config['store_manifest']['dim']}-dim features; "
                         f"{store_path} holds {store.dim}-dim features")
    fp_parts = ("model_id", "weights_hash", "pooling", "max_length")
    trained, here = config["store_manifest"], store.manifest  # fingerprint parts are top-level keys
    differs = [k for k in fp_parts if k in trained and trained.get(k) != here.get(k)]
    if differs:
        raise ValueError(f"{head_dir} was trained on features that differ from {store_path} in {differs}; "
                         f"a head only makes sense on the features it was trained on")
    task = load_task(data_path, store, data_format)
    dropped = None
    if exclude_overlap:
        task, dropped = without_overlap(task, task_rows(load_task(exclude_overlap, store)))
    features = load_features(store, config.get("array", "features"))
    train_cfg = TrainConfig.from_dict(config["train"])
    if task.kind == "labels":  # the labelled set k-NN / probe use: every train text, or the head's shots
        task = for_training(task, dataclasses.replace(train_cfg, hierarchy=False))
    energy = train_cfg.eval_energy
    splits = tuple(s for s in task.eval_sets if s != "dev") or tuple(task.eval_sets)
    metrics = evaluate_head(task, features, model, norm, energy, splits)
    if TEST_SPLIT not in task.eval_sets and splits:  # report the only split there is under the usual keys
        only = metrics.pop(splits[0])
        metrics.update({"baseline": only["baseline"], "head": only["head"], "ci": only["ci"], "split": splits[0]})
    metrics["head_dir"], metrics["data"] = str(head_dir), str(data_path)
    if dropped is not None:
        metrics["overlap_dropped"] = {"with": str(exclude_overlap), **dropped}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "metrics.json", metrics, sort_keys=True)
    return metrics
