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
    decided = [metrics[k]["line"] for k in ("recipe", "reference") if metrics.get(k, {}).get("line")]  # labelled
    # texts: the recipe dev chose and scikit-learn's tuned logistic regression beside the head (label_recipes)
    return "\n".join([table, *decided, *unlabeled, *(f"WARNING: {w}" for w in metrics.get("warnings", []))])
