"""The picture of the robustness study (docs/robust.md, docs/img/robust-tradeoff.png): in-domain test change
against each out-of-domain test change, both against frozen cosine, one point per lever of the table.

Readable where the points cluster: no text on the points; a point's colour is its lever (the default head,
learning rates, the anchor on the dataset's own rows or on STS-B's, a soup), its marker the energy (circle
L1, square cosine), a hollow marker the same heads with `--strength auto`; the table beside the picture
gives each row's numbers. The strength curves a = 0 ... 1 are drawn when the study's JSON holds them.

    python bench/studies/robust_picture.py --json R/robust-study.json --out docs/img/robust-tradeoff.png
    python bench/studies/robust_picture.py --table docs/robust.md --out docs/img/robust-tradeoff.png   # points only

(bench/studies/robust_study.py draws it at the end of a study with `picture`.)
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

KINDS = {  # lever family -> colour, in legend order
    "default head": "tab:blue",
    "learning rate": "tab:orange",
    "anchor, own rows": "tab:green",
    "anchor, STS-B rows": "tab:purple",
    "soup of 3 lrs": "tab:red",
}
ENERGY_MARKERS = {"l1": "o", "cosine": "s"}
AUTO = " + strength auto"


def lever_style(lever: str) -> tuple[str, str, bool]:
    """(family, energy, with --strength auto) of a table row's lever, e.g. 'l1, anchor 0.3 (stsb rows) + ...'."""
    auto = lever.endswith(AUTO)
    base = lever[: -len(AUTO)] if auto else lever
    energy, _, rest = base.partition(",")
    if "soup" in rest:
        kind = "soup of 3 lrs"
    elif "anchor" in rest:
        kind = "anchor, STS-B rows" if "(stsb rows)" in rest else "anchor, own rows"
    elif "lr" in rest:
        kind = "learning rate"
    else:
        kind = "default head"
    return kind, energy.strip(), auto


def picture(results: dict, path: Path) -> None:
    """One panel per (dataset, out-of-domain set) of `results` (robust_study's: frozen, rows, curve, ood)."""
    panels = [(n, o) for n, r in results.items() for o in r["ood"]]
    fig = Figure(figsize=(5.2 * len(panels) + 1.8, 4.8))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, o) in zip(axes, panels):
        r = results[name]
        fz = r["frozen"]
        for energy, curve in r.get("curve", {}).items():
            ax.plot([p[o] - fz[o] for p in curve], [p["test"] - fz["test"] for p in curve], "-", lw=1,
                    color="grey" if energy == "l1" else "silver", zorder=1)
        for row in r["rows"]:
            kind, energy, auto = lever_style(row["lever"])
            if kind not in KINDS or energy not in ENERGY_MARKERS:
                continue
            colour = KINDS[kind]
            ax.scatter(row[o] - fz[o], row["test"] - fz["test"], s=28, marker=ENERGY_MARKERS[energy],
                       facecolors="none" if auto else colour, edgecolors=colour, linewidths=1.1,
                       zorder=3 if kind == "default head" else 2)  # the default over the lr it equals
        ax.axvline(-0.01, color="grey", lw=0.6, ls="--")
        ax.axhline(0, color="black", lw=0.5)
        ax.axvline(0, color="black", lw=0.5)
        ax.xaxis.set_major_locator(MaxNLocator(5))  # tick labels that do not run into each other
        ax.set_xlabel(f"{o}: test change vs frozen cosine")
        ax.set_ylabel(f"{name}: test change vs frozen cosine")
    fig.legend(handles=_legend(any(r.get("curve") for r in results.values())), loc="center right", fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1 - 1.8 / (5.2 * len(panels) + 1.8), 1))
    fig.savefig(path, dpi=130)


def _legend(curves: bool) -> list:
    dot = dict(linestyle="none", markersize=6)
    handles = [Line2D([], [], marker="o", color=c, label=k, **dot) for k, c in KINDS.items()]
    handles += [Line2D([], [], marker=m, color="black", markerfacecolor="black", label=f"energy {e}", **dot)
                for e, m in ENERGY_MARKERS.items()]
    handles.append(Line2D([], [], marker="o", color="black", markerfacecolor="none", label="+ strength auto", **dot))
    handles.append(Line2D([], [], color="grey", ls="--", lw=0.6, label="the -0.01 goal"))
    if curves:
        handles += [Line2D([], [], color=c, lw=1, label=f"strength curve ({e})")
                    for e, c in (("l1", "grey"), ("cosine", "silver"))]
    return handles


def results_from_table(markdown: str, heading: str) -> dict:
    """robust_study's results of one dataset, read back from its table in docs/robust.md (no curves):
    {name: {frozen, rows, ood}}, the dataset named as the heading's first word."""
    lines = markdown[markdown.index(heading):].splitlines()
    header = next(line for line in lines if line.startswith("| lever"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    ood = cols[cols.index("95% CI") + 1: cols.index("OOD dev loss")]
    rows = []
    for line in lines[lines.index(header) + 2:]:
        if not line.startswith("|"):
            break
        cells = dict(zip(cols, (c.strip() for c in line.strip("|").split("|"))))
        test = float(re.split(r"\s*±", cells["test (3-seed mean ± std)"])[0])
        rows.append({"lever": cells["lever"], "test": test, **{o: float(cells[o]) for o in ood}})
    frozen = next(r for r in rows if r["lever"] == "frozen cosine")
    name = heading.lstrip("# ").split()[0].lower()
    return {name: {"frozen": frozen, "rows": [r for r in rows if not r["lever"].startswith("frozen")], "ood": ood}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--json", type=Path, help="robust-study.json that bench/studies/robust_study.py writes")
    src.add_argument("--table", type=Path, help="docs/robust.md: the SciFact table's points (no curves)")
    ap.add_argument("--heading", default="### SciFact (in domain) with Cranfield and CACM")
    ap.add_argument("--out", type=Path, default=Path("docs/img/robust-tradeoff.png"))
    args = ap.parse_args()
    if args.json:
        results = {n: r for n, r in json.loads(args.json.read_text()).items() if r["ood"]}
    else:
        results = results_from_table(args.table.read_text(), args.heading)
    picture(results, args.out)


if __name__ == "__main__":
    main()
