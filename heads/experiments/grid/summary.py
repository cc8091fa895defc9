"""A grid's seed summary: per setting (every setting but the seed) the mean ± std over seeds and a 95%
t-interval of the mean, for the head (`test_*`) and, where the row carries it, for the frozen baseline that
saw exactly its training texts (`base_*`: few-shot stacks). Written as `summary.json` / `summary.md`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
from scipy import stats

from headstore.data.files import atomic_write_json, atomic_write_text
from headstore.heads.artefacts.files import RESULT_PREFIXES, VARIED_EXCLUDE
from headstore.heads.kinds import Task, kind_of

NOT_SETTINGS = VARIED_EXCLUDE | {"seed"}  # result columns that are not settings, and the seed (what is summarised over)


def write_summary(frame: pl.DataFrame, task: Task, out: Path, print_it: bool = True) -> pl.DataFrame:
    """summary.json and summary.md of a grid's rows; printed when the rows carry their own baselines."""
    summary = summarize(frame, kind_of(task).summary_metrics())
    atomic_write_json(out / "summary.json", summary.to_dicts())
    table = summary_table(summary)
    atomic_write_text(out / "summary.md", table + "\n")
    if print_it and not frame.is_empty() and any(c.startswith("base_") for c in frame.columns):
        print(table)
    return summary


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


def summarize(frame: pl.DataFrame, metrics: tuple[str, ...]) -> pl.DataFrame:
    """One row per setting (every setting but the seed): head (`test_*`) and frozen baseline (`base_*`) means
    over seeds of `metrics` (those present)."""
    if frame.is_empty() or "status" not in frame.columns:
        return pl.DataFrame()
    ok = frame.filter(pl.col("status") == "ok")
    if ok.is_empty():
        return pl.DataFrame()
    settings = [c for c in ok.columns if c not in NOT_SETTINGS and not c.startswith(RESULT_PREFIXES)]
    rows = []
    for _, g in ok.group_by(settings, maintain_order=True):
        r = {k: g[k][0] for k in settings}
        r["seeds"] = g.height
        r["train_seconds_mean"] = float(g["train_seconds"].mean())
        for prefix, label in (("test_", "head"), ("base_", "frozen")):
            for m in metrics:
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
    """Markdown: per setting, each summarised metric of the head beside the frozen baseline's (when known)."""
    if summary.is_empty():
        return "(no finished heads)"
    metric_cols = [c for c in summary.columns if c.startswith(("head_", "frozen_"))]
    varied = [c for c in summary.columns if c not in metric_cols and c not in ("seeds", "train_seconds_mean")
              and summary[c].n_unique() > 1]
    keys = varied or ["loss"]
    names = list(dict.fromkeys(c[len("head_"):-len("_mean")] for c in metric_cols
                               if c.startswith("head_") and c.endswith("_mean")))
    shown = [(f"head {m}", f"head_{m}") for m in names]
    shown += [(f"frozen {m}", f"frozen_{m}") for m in names if f"frozen_{m}_mean" in summary.columns]
    lines = ["| " + " | ".join(keys + ["seeds"] + [title for title, _ in shown] + ["train s"]) + " |",
             "|" + "---|" * (len(keys) + len(shown) + 2)]
    for r in summary.sort(keys).to_dicts():
        cells = [str(r[k]) for k in keys] + [str(r["seeds"])] + [_fmt(r, key) for _, key in shown]
        lines.append("| " + " | ".join(cells) + f" | {r['train_seconds_mean']:.1f} |")
    return "\n".join(lines)
