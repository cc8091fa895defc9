"""A head's training curve as a PNG beside its metrics.json (`curve.png`)."""
from __future__ import annotations

from pathlib import Path

from headstore.data.files import atomic_write_figure
from matplotlib.figure import Figure  # no pyplot: files only, the host's backend left as it is


def plot_curve(history: list[dict], path: Path, title: str = "") -> None:
    """Loss (left axis) and dev metric (right axis, when there is a dev split) per epoch."""
    if not history:
        return
    epochs = [h["epoch"] for h in history]
    dev_key = next((k for k in history[0] if k.startswith("dev_")), None)  # None: few-shot heads have no dev
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    ax.plot(epochs, [h["loss"] for h in history], "o-", color="tab:blue", label="train loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("train loss", color="tab:blue")
    if dev_key is not None:
        ax2 = ax.twinx()
        ax2.plot(epochs, [h[dev_key] for h in history], "s-", color="tab:orange", label=dev_key)
        ax2.set_ylabel(dev_key, color="tab:orange")
    ax.set_title(title)
    fig.tight_layout()
    atomic_write_figure(fig, path, dpi=110)  # whole or not at all; an OS error names it
