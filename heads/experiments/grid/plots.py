"""PNG plots of a grid: the primary metric by setting, the best heads' curves (a head's own: heads.artefacts.curve)."""
from __future__ import annotations

from pathlib import Path

from headstore.data.files import atomic_write_figure
from matplotlib.figure import Figure  # no pyplot: files only, the host's backend left as it is

from headstore.heads.kinds.base import PREFIX


def plot_by_setting(rows: list[dict], settings: list[str], metric: str, baseline: float | None, path: Path) -> None:
    """One panel per grid setting: the primary metric of every head against that setting's values."""
    settings = [s for s in settings if len({str(r[s]) for r in rows}) > 1]
    if not settings:
        return
    n = len(settings)
    cols = min(3, n)
    fig = Figure(figsize=(4.2 * cols, 3.2 * ((n + cols - 1) // cols)))
    axes = fig.subplots((n + cols - 1) // cols, cols, squeeze=False)
    for ax, s in zip(axes.flat, settings):
        values = sorted({str(r[s]) for r in rows})
        for i, v in enumerate(values):
            ys = [r[metric] for r in rows if str(r[s]) == v and r.get(metric) is not None]
            ax.scatter([i] * len(ys), ys, alpha=0.6, s=14)
        ax.set_xticks(range(len(values)), values, rotation=30, fontsize=8)
        if baseline is not None:
            ax.axhline(baseline, color="gray", ls="--", lw=1, label="frozen baseline")
        ax.set_title(s, fontsize=9)
        ax.set_ylabel(metric, fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    atomic_write_figure(fig, path, dpi=110)  # whole or not at all; an OS error names it


def plot_best_curves(curves: dict[str, list[dict]], path: Path) -> None:
    """Dev metric per epoch of the best heads, one line each."""
    if not curves:
        return
    fig = Figure(figsize=(10, 3.6))
    axes = fig.subplots(1, 2)
    for name, history in curves.items():
        if not history:
            continue
        dev_key = next((k for k in history[0] if k.startswith("dev_")), None)  # None: few-shot, no dev
        epochs = [h["epoch"] for h in history]
        axes[0].plot(epochs, [h["loss"] for h in history], label=name)
        if dev_key is not None:
            axes[1].plot(epochs, [h[dev_key] for h in history], label=name)
            axes[1].set_ylabel(dev_key)
    axes[0].set_ylabel("train loss")
    for ax in axes:
        ax.set_xlabel("epoch")
    if axes[1].get_legend_handles_labels()[0]:  # few-shot heads have no dev curve to name
        axes[1].legend(fontsize=6)
    fig.tight_layout()
    atomic_write_figure(fig, path, dpi=110)  # whole or not at all; an OS error names it


def metric_family(metric: str) -> str:
    """"manhattan_ndcg@10" / "cosine_ndcg@10" -> "ndcg@10", "spearman_cosine" -> "spearman": a column's
    metric, whatever energy each row scores with."""
    return "_".join(p for p in metric.split("_") if p not in PREFIX.values()) or metric


def plot_gain_vs_change(rows: list[dict], path: Path) -> None:
    """`cli compare`'s picture: per out-of-domain dataset, each setup's in-domain gain over frozen + head
    (x) against its out-of-domain change (y), both paired differences with their 95% CIs as bars."""
    datasets = list(rows[0]["datasets"])
    ind, ood = datasets[0], datasets[1:] or datasets[:1]
    ncol = min(4, 2 * len(ood))  # legend columns: two fit one panel's width, four span two panels or more
    legend_rows = -(-len(rows) // ncol)
    fig = Figure(figsize=(5.2 * len(ood), 4.2 + 0.17 * legend_rows))
    axes = fig.subplots(1, len(ood), squeeze=False)[0]
    colors = {r["setup"]: f"C{i}" for i, r in enumerate(rows)}
    for ax, ds in zip(axes, ood):
        for r in rows:
            x, y = (r["datasets"][d].get("vs_frozen_head") for d in (ind, ds))
            if x is None:  # the reference itself: the origin
                ax.plot(0, 0, "k*", ms=11, label=r["label"])
                continue
            ax.errorbar(x["diff"], y["diff"], xerr=[[x["diff"] - x["ci"][0]], [x["ci"][1] - x["diff"]]],
                        yerr=[[y["diff"] - y["ci"][0]], [y["ci"][1] - y["diff"]]], fmt="o", ms=5, capsize=3,
                        color=colors[r["setup"]], label=r["label"])
        ax.axhline(0, color="gray", lw=0.8)
        ax.axvline(0, color="gray", lw=0.8)
        ax.locator_params(axis="x", nbins=5)  # signed tick labels of 6 characters: few enough not to touch
        ax.set_xlabel(f"in-domain gain vs frozen + head ({ind}, {metric_family(rows[0]['datasets'][ind]['metric'])})",
                      fontsize=9)
        ax.set_ylabel(f"out-of-domain change ({ds}, {metric_family(rows[0]['datasets'][ds]['metric'])})", fontsize=9)
        ax.set_title(f"{ds}\n95% two-level CIs, paired by seed and item", fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(ncol, len(labels)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.035 * legend_rows / (fig.get_figheight() / 4.6) + 0.02, 1, 1))
    atomic_write_figure(fig, path, dpi=120)  # whole or not at all; an OS error names it
