"""`cli grid` on labelled texts: heads x shots x seeds, the frozen baseline on the same texts beside.

The grid file is the usual one (`heads.experiments.grid.read_grid`); the labelled-text settings are
TrainConfig fields: `shots` (texts per class; 0 = all of train), `hierarchy`, `per_class`. The
few-shot protocol is SetFit's / MTEB's: for each shot count n and seed s, n texts per class are drawn
with s (`heads.label_tasks.few_shot_indices`), a head trains on them for its epochs (no dev: the
last epoch is kept) and the whole test split is scored. The frozen baseline of each (n, s) — the
probe on the stored features of the same texts, k-NN under cosine and L1 — is stored in the same
row (`base_*`), so every head is compared with the baseline that saw exactly its labels.

Outputs (`out/`): `results.parquet` / `results.csv` (one row per head; written after every stack,
so a rerun skips finished heads), `summary.json` / `summary.md`: per setting (all but the seed) the
mean ± std over seeds and a 95% t-interval of the mean for the head and for its frozen baseline.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import polars as pl
import torch
from scipy import stats
from tqdm.auto import tqdm

from headstore.data.files import atomic_write_json, atomic_write_parquet, atomic_write_text
from headstore.featurize.store import FeatureStore
from headstore.heads.config import stack_key
from headstore.heads.evaluate import embed_rows, evaluate_split, primary_metric
from headstore.heads.experiments.grid import _flat, head_id, read_grid, split_settings
from headstore.heads.features import load_features
from headstore.heads.label_tasks import for_training, loss_mismatch
from headstore.heads.model import HeadConfig, save_heads
from headstore.heads.tasks import load_task
from headstore.heads.train import train_stack

# metrics summarised per setting (those present: per-level and retrieval ones join when computed)
SUMMARY_METRICS = ("probe_accuracy", "probe_macro_f1", "manhattan_knn_accuracy", "cosine_knn_accuracy",
                   "euclidean_knn_accuracy", "manhattan_ndcg@10", "cosine_ndcg@10", "manhattan_map", "cosine_map")
NOT_SETTINGS = {"head_id", "stack", "status", "reason", "best_epoch", "train_seconds", "eval_seconds", "primary",
                "history", "seed"}


def _baseline(task, X: torch.Tensor) -> dict:
    """Frozen features on the task's labelled texts: probe, k-NN under cosine and L1 (test split)."""
    res, _ = evaluate_split(task, "test", lambda r: embed_rows(None, X, r), ("cosine", "l1"))
    return {f"base_{k}": v for k, v in res[0].items()}


def run_label_grid(store_path: str, data_path: str, grid_path: str, out_dir: str, data_format: str | None = None,
                   progress: bool = True, score_split: str = "test") -> pl.DataFrame:
    """Train every head of the grid on its labelled texts; write results and the seed summary.

    `score_split="dev"` scores few-shot heads on the dev slice instead of test (choosing few-shot
    settings without looking at test: bench/labels_fewshot_dev.py); the shots never come from it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    store = FeatureStore.open(store_path)
    task = load_task(data_path, store, data_format)
    if task.kind != "labels":
        raise ValueError(f"{data_path}: run_label_grid needs labelled texts (--format labels), got {task.kind!r}")
    combos = read_grid(grid_path)
    (out / "grid.toml").write_text(Path(grid_path).read_text())
    data_key = f"{data_path}|{data_format or 'labels'}"
    rows = pl.read_parquet(out / "results.parquet").to_dicts() if (out / "results.parquet").is_file() else []
    done = {r["head_id"] for r in rows}
    groups: dict[tuple, list] = {}
    for s in combos:
        hid = head_id(s, data_key, store.fingerprint)
        if hid in done:
            continue
        head, train, array = split_settings(s)
        reason = loss_mismatch(task, train.loss) or _cannot_build(task, train)
        if reason:
            rows.append({"head_id": hid, **_flat(head, train, array), "status": "skipped", "reason": reason})
            done.add(hid)
            continue
        key = (json.dumps(asdict(head), sort_keys=True), stack_key(train), array)
        groups.setdefault(key, []).append((hid, head, train, array))
    features: dict[str, torch.Tensor] = {}
    baselines: dict[tuple, dict] = {}
    bar = tqdm(total=sum(len(g) for g in groups.values()), desc="label grid heads", disable=not progress)
    for (_, _, array), items in groups.items():
        if array not in features:
            features[array] = load_features(store, array)
        X = features[array]
        configs = [it[2] for it in items]
        stask = for_training(task, configs[0])
        if score_split != "test":
            if not configs[0].shots:
                raise ValueError(f"score_split={score_split!r} is for few-shot heads (shots > 0), which select on nothing")
            stask = replace(stask, eval_sets={"test": replace(task.eval_sets[score_split], full=True)})
        base_key = (array, configs[0].shots, configs[0].seed if configs[0].shots else 0, score_split)
        if base_key not in baselines:
            baselines[base_key] = _baseline(stask, X)
        head_cfg = HeadConfig(**{**asdict(items[0][1]), "in_dim": X.shape[1]})
        t0 = time.perf_counter()
        model, norm, runs = train_stack(stask, X, head_cfg, configs, progress=False)
        t1 = time.perf_counter()
        energy = configs[0].eval_energy
        Xn = norm(X)
        test, _ = evaluate_split(stask, "test", lambda r: embed_rows(model, Xn, r), (energy,))
        dev = evaluate_split(stask, "dev", lambda r: embed_rows(model, Xn, r), (energy,))[0] if "dev" in stask.eval_sets else None
        t2 = time.perf_counter()
        (out / "heads").mkdir(exist_ok=True)
        save_heads(out / "heads" / f"{items[0][0]}.safetensors", model)
        for h, (hid, head, train, _) in enumerate(items):
            row = {"head_id": hid, "stack": items[0][0], **_flat(head, train, array), "status": runs[h].status,
                   "reason": runs[h].reason, "best_epoch": runs[h].best_epoch,
                   "train_seconds": (t1 - t0) / len(items), "eval_seconds": (t2 - t1) / len(items),
                   "primary": primary_metric("labels", energy), "history": json.dumps(runs[h].history),
                   "n_labelled": len(stask.reference)}
            row.update({f"test_{k}": v for k, v in test[h].items()})
            if dev is not None:
                row.update({f"dev_{k}": v for k, v in dev[h].items()})
            row.update(baselines[base_key])
            rows.append(row)
        _write(out, rows)
        bar.update(len(items))
    bar.close()
    frame = _write(out, rows) if rows else pl.DataFrame()
    summary = summarize(frame)
    atomic_write_json(out / "summary.json", summary.to_dicts())
    table = summary_table(summary)
    atomic_write_text(out / "summary.md", table + "\n")
    if progress:
        print(table)
    return frame


def _cannot_build(task, train) -> str:
    """Why the labelled texts cannot serve this config (--hierarchy on flat labels), else ""."""
    try:
        for_training(task, train)
    except ValueError as err:
        return str(err)
    return ""


def _write(out: Path, rows: list[dict]) -> pl.DataFrame:
    frame = pl.DataFrame(rows, infer_schema_length=None)
    atomic_write_parquet(out / "results.parquet", frame)
    atomic_write_text(out / "results.csv", frame.drop([c for c in ("history",) if c in frame.columns]).write_csv())
    return frame


def mean_std_ci(values) -> dict:
    """mean, sample std and the 95% t-interval of the mean over seeds (std 0 and no interval for one seed)."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return {"mean": float("nan"), "std": float("nan"), "ci_lo": float("nan"), "ci_hi": float("nan"), "n": 0}
    mean, std = float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else 0.0
    lo, hi = (stats.t.interval(0.95, len(x) - 1, loc=mean, scale=std / np.sqrt(len(x))) if len(x) > 1 and std > 0
              else (mean, mean))
    return {"mean": mean, "std": std, "ci_lo": float(lo), "ci_hi": float(hi), "n": int(len(x))}


def summarize(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per setting (every setting but the seed): head and baseline metrics over seeds."""
    if frame.is_empty() or "status" not in frame.columns:
        return pl.DataFrame()
    ok = frame.filter(pl.col("status") == "ok")
    if ok.is_empty():
        return pl.DataFrame()
    settings = [c for c in ok.columns if c not in NOT_SETTINGS and not c.startswith(("test_", "dev_", "base_"))
                and c != "n_labelled"]
    rows = []
    for _, g in ok.group_by(settings, maintain_order=True):
        r = {k: g[k][0] for k in settings}
        r["seeds"] = g.height
        r["train_seconds_mean"] = float(g["train_seconds"].mean())
        for prefix, label in (("test_", "head"), ("base_", "frozen")):
            for m in SUMMARY_METRICS:
                if prefix + m in g.columns and g[prefix + m].null_count() < g.height:
                    for k, v in mean_std_ci(g[prefix + m].drop_nulls().to_numpy()).items():
                        if k != "n":
                            r[f"{label}_{m}_{k}"] = v
        rows.append(r)
    return pl.DataFrame(rows, infer_schema_length=None)


def _fmt(r: dict, key: str) -> str:
    if r.get(f"{key}_mean") is None:
        return "-"
    return f"{r[key + '_mean']:.3f} ± {r[key + '_std']:.3f} [{r[key + '_ci_lo']:.3f}, {r[key + '_ci_hi']:.3f}]"


def summary_table(summary: pl.DataFrame) -> str:
    """Markdown: per setting, the head's probe and k-NN accuracy beside the frozen probe and k-NN."""
    if summary.is_empty():
        return "(no finished heads)"
    varied = [c for c in summary.columns if not c.startswith(("head_", "frozen_")) and c not in
              ("seeds", "train_seconds_mean") and summary[c].n_unique() > 1]
    keys = varied or ["loss"]
    lines = ["| " + " | ".join(keys) + " | seeds | head probe acc | head k-NN acc (own energy) | frozen probe acc "
             "| frozen k-NN acc (cosine) | train s |",
             "|" + "---|" * (len(keys) + 6)]
    for r in summary.sort(keys).to_dicts():
        knn = next((f"head_{m}" for m in ("manhattan_knn_accuracy", "cosine_knn_accuracy", "euclidean_knn_accuracy")
                    if r.get(f"head_{m}_mean") is not None), "head_manhattan_knn_accuracy")
        lines.append("| " + " | ".join(str(r[k]) for k in keys) + f" | {r['seeds']} | {_fmt(r, 'head_probe_accuracy')} | "
                     f"{_fmt(r, knn)} | {_fmt(r, 'frozen_probe_accuracy')} | {_fmt(r, 'frozen_cosine_knn_accuracy')} | "
                     f"{r['train_seconds_mean']:.1f} |")
    return "\n".join(lines)
