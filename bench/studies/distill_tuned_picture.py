"""The picture of the tuned-teacher students (docs/distill.md, docs/img/distill-tuned-students.png): each student's
test figure with its two-level 95% CI (seeds and pairs), between the single head (frozen + head) and the tuned
teacher it learns from, read from bench/studies/distill_runs_ci.py's JSON files, one per student.

    python3 bench/studies/distill_tuned_picture.py --json 'all six layers mixed=bench/results/A.json' \\
        --json 'all six layers side by side=bench/results/B.json' --out docs/img/distill-tuned-students.png

A student whose JSON has another teacher than the first's (another tuned setup, or a figure over the teacher's
seeds) gets that teacher as a row of its own.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from matplotlib.figure import Figure


def draw(students: list[tuple[str, dict]], path: Path) -> None:
    first = students[0][1]
    single, teacher = first["test"]["single"], first["test"]["teacher"]
    # a student whose teacher is not the first one's (another tuned setup, or the teacher over its seeds) gets
    # its own teacher row, named after it
    other_teachers = [(f"teacher of: {label}", r["test"]["teacher"], r["ci"]["teacher"], "tab:red")
                      for label, r in students[1:] if abs(r["test"]["teacher"] - teacher) > 1e-9]
    longest = max(len(r[0]) for r in students) + 22  # the row labels' characters, "distilled: ... (NN% of the gain)"
    fig = Figure(figsize=(max(7.5, 4.5 + 0.07 * longest), 1.2 + 0.55 * (len(students) + 2 + len(other_teachers))))
    ax = fig.subplots()
    rows = [("frozen + head (the single head)", single, first["ci"]["single"], "tab:gray"),
            *[(f"distilled: {label} ({r['share']:.0%} of the gain)", r["test"]["distilled"], r["ci"]["distilled"],
               "tab:blue") for label, r in students],
            ("teacher: fine-tuned encoder + head", teacher, first["ci"]["teacher"], "tab:orange"), *other_teachers]
    for y, (label, value, (lo, hi), colour) in enumerate(rows):
        ax.errorbar(value, y, xerr=[[value - lo], [hi - value]], fmt="o", color=colour, capsize=3)
        ax.annotate(f"{value:.4f}", (value, y), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8)
    ax.axvspan(single, teacher, color="tab:orange", alpha=0.08)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("test Spearman (95% CI over seeds and pairs)")
    ax.set_title("A tuned encoder distilled into a head on frozen features", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="append", required=True, help="LABEL=PATH of a distill_runs_ci.py JSON.")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    students = []
    for item in args.json:
        label, sep, path = item.partition("=")
        if not sep:
            parser.error(f"--json {item!r}: expected LABEL=PATH")
        students.append((label, json.loads(Path(path).read_text())))
    draw(students, Path(args.out))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
