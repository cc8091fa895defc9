"""The picture of the ensemble -> one head study (docs/distill.md, docs/img/distill-teacher-student.png): per dataset
(in domain, then each out-of-domain set), the change against the best single pair-trained head of the teacher (the
ensemble) and of the distilled heads (anchors with and without the unlabeled texts), means over seeds; the bar
of the in-domain teacher carries the two-level 95% CI of its difference to the single head, as do the students.

    python3 bench/studies/distill_picture.py --json bench/results/distill-study-zen4-DATE.json \\
        --out docs/img/distill-teacher-student.png
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from matplotlib.figure import Figure

BARS = (("teacher", "teacher (ensemble)", "tab:orange"), ("with", "distilled, anchors + unlabeled", "tab:blue"),
        ("without", "distilled, task anchors only", "tab:cyan"))


def points(rows: list[dict]) -> list[tuple[str, dict]]:
    """(label, {bar: (value, ci or None)}) per dataset and out-of-domain set, changes against the single head."""
    out = []
    for name in dict.fromkeys(r["dataset"] for r in rows):
        rs = {r["variant"]: r for r in rows if r["dataset"] == name}
        first = next(iter(rs.values()))
        single = first["test"]["single"]
        values = {"teacher": (first["test"]["teacher"] - single, first["teacher_minus_single_ci"])}
        for variant, r in rs.items():
            values[variant] = (r["test"]["distilled"] - r["test"]["single"], r["distilled_minus_single_ci"])
        out.append((f"{name} (test)", values))
        for t in first["transfer"]["single"]:
            values = {"teacher": (first["transfer"]["teacher"][t] - first["transfer"]["single"][t], None)}
            for variant, r in rs.items():
                values[variant] = (r["transfer"]["distilled"][t] - r["transfer"]["single"][t], None)
            out.append((t.split("-")[0], values))
    return out


def draw(rows: list[dict], path: Path) -> None:
    pts = points(rows)
    fig = Figure(figsize=(8, 4), dpi=120)
    ax = fig.subplots()
    width = 0.8 / len(BARS)
    for i, (key, label, colour) in enumerate(BARS):
        xs = [j + (i - 1) * width for j, (_, v) in enumerate(pts) if key in v]
        ys = [v[key][0] for _, v in pts if key in v]
        errs = [v[key][1] for _, v in pts if key in v]
        if not xs:  # a variant no study row has: no bar, no legend entry
            continue
        ax.bar(xs, ys, width, label=label, color=colour)
        for x, y, ci in zip(xs, ys, errs):
            if ci:
                ax.plot([x, x], ci, color="black", lw=1)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(pts)), [p for p, _ in pts])
    ax.set_ylabel("change vs the best single head")
    ax.set_title("Ensemble -> one head: teacher and distilled student, mean over seeds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="append", required=True, help="A study's JSON (repeatable: rows joined).")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = [r for p in args.json for r in json.loads(Path(p).read_text())["rows"]]
    draw(rows, Path(args.out))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
