"""`cli compare`'s in-domain rows split into seen and unseen queries (heads.kinds.seen): does tuning the encoder
help the queries whose relevant documents training never judged?

Each eval record of the in-domain dataset keeps its seen mask (eval_head's `items["seen"]`, from the head's
training judgements); a part is then a dataset of its own, `"<dataset> seen"` / `"<dataset> unseen"`, whose
records hold the part's per-query values, and every row gets the same figures and paired differences on it as
on the whole (compare_table's two-level bootstrap). compare.json keeps them under each row's "parts";
compare.md gives them a table. Eval records from before the mask (a resumed older run) have no parts.
"""
from __future__ import annotations

import numpy as np
from tabulate import tabulate

from headstore.heads.kinds.seen import PARTS

MIN_QUERIES = 2  # a part of fewer queries has no bootstrap interval: left out


def part_name(dataset: str, part: str) -> str:
    return f"{dataset} {part}"


def split_evals(evals: dict, dataset: str) -> tuple[dict, list[str]]:
    """(eval records of each part of `dataset` keyed as evals are, the part names every record has): each
    record's items, figure and baseline cut to the part's queries."""
    out: dict = {}
    for (enc, seed, name), rec in evals.items():
        if name != dataset or not rec.get("seen"):
            continue
        mask = np.asarray(rec["seen"], dtype=bool)
        for part, keep in zip(PARTS, (mask, ~mask)):
            if keep.sum() < MIN_QUERIES:
                continue
            items = {k: np.asarray(v, dtype=np.float64)[keep].tolist() for k, v in rec["items"].items()}
            out[enc, seed, part_name(dataset, part)] = {
                **rec, "items": items, "value": float(np.mean(items["head"])),
                "baseline": float(np.mean(items["baseline"])), "n_scored": int(keep.sum()), "seen": None}
    keys = [k for k in evals if k[2] == dataset]
    names = [part_name(dataset, p) for p in PARTS if all((k[0], k[1], part_name(dataset, p)) in out for k in keys)]
    return out, names


def parts_section(rows: list[dict], dataset: str, fmt_figure, fmt_diff) -> str:
    """compare.md's table of the rows on each part of `dataset` ("" without parts): figure [CI] and the paired
    difference from frozen + head, per part."""
    names = list(rows[0].get("parts", {}))
    if not names:
        return ""
    table = [[r["label"], *[f"{fmt_figure(r['parts'][n])} n={r['parts'][n]['n']}" for n in names],
              *[fmt_diff(r["parts"][n]) for n in names]] for r in rows]
    heads = ["setup", *names, *[f"Δ {n}" for n in names]]
    return "\n\n".join([
        f"## {dataset} split by seen / unseen queries (seen: a relevant document judged in training; figure and "
        "paired Δ from frozen + head as above)",
        tabulate(table, headers=heads, tablefmt="github", disable_numparse=True)])
