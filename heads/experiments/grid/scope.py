"""Which heads of a grid stack are ranked on test (`cli grid --test-scope`, config.TEST_SCOPES).

"all": every head. "selected": the heads of the stack's dev-best configuration (every seed), by the grid's one
ranking rule (artefacts.ranked_configs: the dev mean over seeds; with --select-ood the selection rule), so test is
reported once, for what dev chose, as train-head reports one head. "auto": all, except for a stack whose dev was
ranked on candidates (an IR corpus above exact_max): each test ranking is exact over the whole corpus, per head
(64 heads x 1M documents: ~15 min of a 2-core CPU), so there the selected configuration only. The grid's best
configuration is the best of its own stack, so it always has its test figures.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from headstore.heads.artefacts.files import rule_key
from headstore.heads.evaluation.evaluate import embedder, evaluate_split


def heads_to_test(scope: str, dev_on_candidates: bool, scores: dict, runs: list, configs: list, primary: str,
                  delta: float) -> set[int]:
    """The stack positions of the heads to rank on test under `scope` (scores: the stack's dev, and "sel")."""
    if scope == "all" or (scope == "auto" and not dev_on_candidates):
        return set(range(len(runs)))
    return best_configuration(scores, runs, configs, primary, delta)


def best_configuration(scores: dict, runs: list, configs: list, primary: str, delta: float) -> set[int]:
    """The heads of the stack's best configuration (its settings but the seed) on the dev scores; failed heads
    are left out (none at all: an empty set)."""
    groups: dict = {}
    for h, (run, cfg) in enumerate(zip(runs, configs)):
        if run.status == "ok":
            groups.setdefault(replace(cfg, seed=0), []).append(h)
    if not groups or "dev" not in scores:
        return set()
    dev = [m[primary] for m in scores["dev"][0]]
    loss = scores["sel"][0].tolist() if "sel" in scores else None

    def key(heads: list[int]) -> tuple:
        mean_loss = None if loss is None else float(np.mean([loss[h] for h in heads]))
        return rule_key(float(np.nanmean([dev[h] for h in heads])), mean_loss, delta)
    return set(max(groups.values(), key=key))  # ties: the first configuration, as ranked_configs keeps them


def scored_heads(task, split: str, model, Xn, energy: str, heads: list[int]) -> tuple[list, list]:
    """evaluate_split of `split` for the given heads of the stack only: (metrics, items) per stack position,
    None for a head not scored."""
    if not heads:
        return [None] * model.n_heads, [None] * model.n_heads
    stack = model if len(heads) == model.n_heads else model.select_heads(heads)
    metrics, items = evaluate_split(task, split, embedder(stack, Xn), (energy,))
    where = {h: i for i, h in enumerate(heads)}
    return ([metrics[where[h]] if h in where else None for h in range(model.n_heads)],
            [items[where[h]] if h in where else None for h in range(model.n_heads)])


def check_resumed_scope(rows: list[dict], test_scope: str, out, version: int) -> None:
    """Resumed heads keep the test columns they were scored with: a rerun under another --test-scope would mix
    heads ranked on test under two rules, so it is refused (rows from before the column: scored under auto)."""
    scopes = sorted({r.get("test_scope") or "auto" for r in rows
                     if r.get("status") == "ok" and r.get("grid_version") == version})
    if scopes and scopes != [test_scope]:
        raise ValueError(f"{out}: its finished heads were scored with --test-scope {', '.join(scopes)}; rerun with "
                         f"--test-scope {scopes[0]} to resume, or with --overwrite to train and score every head "
                         f"under --test-scope {test_scope}")
