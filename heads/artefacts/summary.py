"""The terminal view of a metrics.json: baseline vs head, primary metric and 95% CI, one row per split.

The full figures stay in metrics.json; the terminal gets what a reader compares at a glance.
"""
from __future__ import annotations

from tabulate import tabulate

from headstore.heads.kinds.unlabeled import unlabeled_line


def _ci(ci) -> str:
    return f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci and len(ci) == 2 else "–"


def metrics_table(metrics: dict) -> str:
    """A plain-text table of `metrics` (train_head / eval_head's return value)."""
    primary, base_primary = metrics["primary"], metrics["baseline_primary"]
    blocks = []
    if "dev" in metrics:
        blocks.append(("dev", metrics["dev"]))
    if "head" in metrics:
        blocks.append((metrics.get("split", "test"), metrics))
    rows = []
    for split, block in blocks:
        base, head, ci = block["baseline"][base_primary], block["head"][primary], block.get("ci", {})
        rows.append((split, f"{base:.4f}", _ci(ci.get("baseline")), f"{head:.4f}", _ci(ci.get("head")),
                     f"{head - base:+.4f}"))
    headers = ["split", f"baseline {base_primary}", "95% CI", f"head {primary}", "95% CI", "head - baseline"]
    table = tabulate(rows, headers=headers, disable_numparse=True)
    unlabeled = [unlabeled_line(metrics["unlabeled"])] if metrics.get("unlabeled") else []  # how many, which roles
    parts = [parts_table(block["parts"], split, base_primary, primary) for split, block in blocks if "parts" in block]
    parts += [f"note: {metrics['parts_note']}"] if metrics.get("parts_note") else []
    decided = [metrics[k]["line"] for k in ("recipe", "reference") if metrics.get(k, {}).get("line")]  # labelled
    # texts: the recipe dev chose and scikit-learn's tuned logistic regression beside the head (label_recipes)
    return "\n".join([table, *decided, *unlabeled, *parts, *(f"WARNING: {w}" for w in metrics.get("warnings", []))])


def _signed_ci(ci) -> str:
    return f"[{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci and len(ci) == 2 else ""


def parts_table(parts: dict, split: str, base_primary: str, primary: str) -> str:
    """The seen / unseen / all table of one split's "parts" (heads.kinds.seen.seen_parts), with its note."""
    rows = []
    for part in ("seen", "unseen", "all"):
        p = parts[part]
        if not p["n"]:
            rows.append((part, "0", "", "", ""))
            continue
        rows.append((part, str(p["n"]), f"{p['baseline']:.4f}", f"{p['head']:.4f}",
                     f"{p['delta']:+.4f} {_signed_ci(p['ci']['delta'])}".rstrip()))
    title = (f"{split}: seen / unseen queries (seen: a relevant document judged in training); frozen {base_primary}, "
             f"head {primary}; 95% CI paired over queries")
    table = tabulate(rows, headers=["part", "n", "frozen", "head", "head - frozen [95% CI]"],
                     disable_numparse=True)
    return "\n".join([title, table, *([f"note: {parts['note']}"] if parts.get("note") else [])])
