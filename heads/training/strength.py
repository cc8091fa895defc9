"""Strength after training (`--strength`; issue 20, lever 1; WiSE-FT, Wortsman et al. 2022).

A trained residual head is f(x) = x + g(x). Its strength-a version is f_a(x) = x + a g(x), a in [0, 1]:
a = 0 is the starting point (the frozen features), a = 1 the trained head. Since g's last layer is
affine, a g(x) is g with its last layer's weight and bias times a: f_a is again a residual head of the
same shape, so Head, Pipeline, eval, index and export apply it with nothing new (export: the last Dense
scaled). For any other head shape the same interpolation is done in weight space toward the starting
point (each parameter p0 + a (p - p0)); for the residual head the two agree, since g's last layer starts
at zero (a mixing head's mix weights are interpolated too, so a = 0 is its starting point exactly).

`--strength auto` chooses a after training, on dev only: every a of STRENGTHS is scored on the in-domain
dev split and on the `--select-ood` dev sets, and heads.training.selection's rule picks it (the best in-domain dev
whose worst out-of-domain dev loss is <= delta, else the least-losing; ties go to the larger a). Without
`--select-ood` the rule is the in-domain dev metric alone. A number fixes a.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from headstore.data.files import atomic_write_figure
from headstore.heads.settings.config import parse_strength  # noqa: F401 (the setting's parser, with the rule)
from headstore.heads.network.model import StackedMLP, start_of
from headstore.heads.training.selection import rule_key

STRENGTHS = tuple(i / 10 for i in range(11))  # 0, 0.1, ..., 1: 11 dev passes, a step finer than dev noise


def _moved(model: StackedMLP) -> set[str]:
    """Names of the parameters the strength interpolates: for a residual head g's last layer (and the mix),
    for any other head every parameter."""
    cfg = model.cfg
    names = {n for n, _ in model.named_parameters()}
    if cfg.residual and cfg.depth > 0:
        last = cfg.depth - 1
        return {f"weights.{last}", f"biases.{last}", "mix_logits"} & names
    return names


def with_strength(model: StackedMLP, alphas: Sequence[float]) -> StackedMLP:
    """A copy of the stack with head h at strength alphas[h] (module doc). a = 1 leaves a head's weights
    as they are and a = 0 gives its starting point, both exactly."""
    if len(alphas) != model.n_heads:
        raise ValueError(f"one strength per head: {len(alphas)} for {model.n_heads} heads")
    out = copy.deepcopy(model)
    start = dict(start_of(model).named_parameters())
    moved = _moved(model)
    with torch.no_grad():
        for name, p in out.named_parameters():
            if name not in moved:
                continue
            p0 = start[name]
            for h, a in enumerate(alphas):
                if a == 1.0:
                    continue
                p[h] = p0[h] if a == 0.0 else p0[h] + float(a) * (p[h] - p0[h])
    return out


def choose(curves: list[list[dict]], delta: float) -> list[float]:
    """The chosen a of every head from its curve (points {"strength", "dev", "ood_loss"}): heads.training.selection's
    rule, ties to the larger a."""
    chosen = []
    for curve in curves:
        best = max(curve, key=lambda pt: (rule_key(pt["dev"], pt.get("ood_loss"), delta), pt["strength"]))
        chosen.append(best["strength"])
    return chosen


def strength_curves(model: StackedMLP, score: Callable[[StackedMLP], tuple[list[float], Optional[list], dict]],
                    strengths: Sequence[float] = STRENGTHS) -> list[list[dict]]:
    """Per head, one point per a: `score(stack)` -> (dev per head, worst OOD dev loss per head or None,
    {set name: metric per head})."""
    curves: list[list[dict]] = [[] for _ in range(model.n_heads)]
    for a in strengths:
        dev, loss, per_set = score(with_strength(model, [a] * model.n_heads))
        for h in range(model.n_heads):
            pt = {"strength": a, "dev": float(dev[h])}
            if loss is not None:
                pt["ood_loss"] = float(loss[h])
                pt.update({f"ood_dev_{n}": float(v[h]) for n, v in per_set.items()})
            curves[h].append(pt)
    return curves


def plot_strength(curve: list[dict], chosen: float, path: Path, metric: str, title: str = "") -> None:
    """In-domain dev against out-of-domain dev (each --select-ood set) over a, or dev against a alone."""
    from matplotlib.figure import Figure  # here: only a strength sweep plots; no pyplot (the host's backend kept)

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    sets = sorted(k[len("ood_dev_"):] for k in curve[0] if k.startswith("ood_dev_"))
    dev = [pt["dev"] for pt in curve]
    if sets:
        for name in sets:
            xs = [pt[f"ood_dev_{name}"] for pt in curve]
            ax.plot(xs, dev, "o-", label=f"{name} (dev)")
            for pt, x in zip(curve, xs):
                ax.annotate(f"{pt['strength']:g}", (x, pt["dev"]), fontsize=7, textcoords="offset points",
                            xytext=(3, 3), color="red" if pt["strength"] == chosen else "black")
        ax.set_xlabel("out-of-domain dev metric (the --select-ood sets)")
        ax.legend()
    else:
        ax.plot([pt["strength"] for pt in curve], dev, "o-")
        ax.axvline(chosen, color="red", lw=0.8)
        ax.set_xlabel("strength a")
    ax.set_ylabel(f"in-domain dev {metric}")
    ax.set_title(title or f"strength a: chosen {chosen:g}")
    fig.tight_layout()
    atomic_write_figure(fig, path, dpi=110)  # whole or not at all; an OS error names it
