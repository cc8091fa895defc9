"""The lines under `cli compare`'s tables: how the figures were made (`method`), how each MLM run ended
(`adaptation_note`), how each tuned encoder was trained (`tuning_note`) and where the run's time went
(`time_split`). Each reads only the config, the step records and the built encoders, so a resumed run
prints the same notes as one that ran straight through.
"""
from __future__ import annotations

from headstore.featurize.tuning.settle import SETTLE_CHANGE, settled

# where a step's seconds go in the time split: the first prefix that matches its name (compare's step names)
TIME_PARTS = (("featurize-", "stores"), ("mlm-probe", "MLM adaptation"), ("adapt-", "MLM adaptation"),
              ("finetuned-", "tuning"), ("adapters-", "tuning"), ("lora-", "tuning"), ("head-", "heads"),
              ("eval-", "evaluation"), ("mlm-", "forgetting probe"))


def method(cfg) -> str:
    """What the figures are: data, seeds, the two-level CIs, the cost columns, the MLM loss."""
    return (f"In-domain: {cfg.in_domain} (test split); out of domain: {', '.join(cfg.out_of_domain) or 'none'} "
            "(test split, or the only split" + ("; pairs / queries using an in-domain text dropped" if
                                               cfg.ood_exclude_overlap else "") + "). "
            f"Seeds {list(cfg.seeds)}" + (f", encoders tuned at the first {cfg.tune_seeds}" if cfg.tune_seeds else "")
            + f". CIs: {cfg.n_boot} two-level bootstrap resamples, each drawing the row's seeds with replacement "
            "and the test queries / pairs with replacement (the mean over the drawn seeds of each seed's figure on "
            "the drawn items), so they hold the spread between training runs as well as between queries; a "
            "difference pairs each seed with frozen + head at the same seed (a tuned encoder starts from it) and the "
            "same items; the frozen cosine row, the same at every seed, is set against each seed of frozen + head. "
            "seconds: what producing the setup cost from scratch (featurize, adapt, train-head, finetune with its "
            "learning-rate candidates; evaluation excluded), mean over seeds; peak MB: the largest resident memory "
            "of the compare process during one of its steps. MLM loss: masked-token cross-entropy, the same masks "
            "for every model, under the probe head trained on the frozen encoder (the MLM-adapted encoder: its own "
            "head); general = wikitext-2 lines, in-domain = texts held out of adaptation.")


def adaptation_note(steps) -> str:
    """One line: each MLM training run's steps, final loss, why it stopped and whether its loss settled
    (featurize.tuning.settle, computed again from the loss curve in its record)."""
    runs = {n: r for n, r in steps.results.items() if n == "mlm-probe" or n.startswith("adapt-")}
    parts = []
    for n, r in runs.items():
        ok, drop = settled(r.get("losses") or [])
        why = {"settled": "stopped at a settled check", "cap": "stopped at the cap"}.get(r.get("stopped"), "")
        parts.append(f"{n}: {r['steps']} steps{' (' + why + ')' if why else ''}, loss {r['last_loss_mean10']:.3f}, "
                     + ("settled" if ok else "NOT settled")
                     + ("" if drop is None else f" (middle to last quarter {-100 * drop:+.1f}%)"))
    if not parts:
        return ""
    return (f"MLM runs (settled = the loss fell, and its last quarter is within {100 * SETTLE_CHANGE:.0f}% of its "
            "middle quarter): " + "; ".join(parts) + ".")


def tuning_note(built: dict) -> str:
    """One line per tuned encoder family: the learning rate chosen on dev (at the first tuning seed, with each
    candidate's dev figure), and per seed the epochs run, the epoch kept and why training stopped."""
    lines = []
    for name, per_seed in built.items():
        records = [(s, b.tuning) for s, b in sorted(per_seed.items()) if getattr(b, "tuning", None)]
        if not records:
            continue
        first = records[0][1]
        cands = ", ".join(f"{lr:g}: {dev:.4f}" for lr, dev in first.get("candidates", []))
        runs = "; ".join(f"s{s}: best epoch {t.get('best_epoch')} of {t.get('epochs_run')} "
                         f"({t.get('stopped_because', '?')})" for s, t in records)
        lines.append(f"{name}: encoder lr {first['encoder_lr']:g} chosen on dev at seed {records[0][0]}"
                     + (f" (dev figure per candidate: {cands})" if cands else "") + f"; {runs}.")
    if not lines:
        return ""
    return ("Tuning (every tuned setup: the whole train split, the head's loss and mined negatives, epochs until dev "
            "stops improving, the best dev epoch kept; dev scored with the training encoder on the dev queries / "
            "pairs and a fixed corpus subsample; the learning rate chosen on dev at the first seed and kept for the "
            "others): " + " ".join(lines))


def time_split(steps) -> dict[str, float]:
    """Seconds of every step of the run (reused steps: their recorded seconds) by part: stores, MLM adaptation,
    tuning, heads, evaluation, forgetting probe (TIME_PARTS)."""
    split: dict[str, float] = {}
    for name, seconds in steps.seconds.items():
        part = next((p for prefix, p in TIME_PARTS if name.startswith(prefix)), "other")
        split[part] = split.get(part, 0.0) + seconds
    return split


def time_note(split: dict[str, float]) -> str:
    total = sum(split.values())
    if not total:
        return ""
    parts = ", ".join(f"{p} {s / 60:.1f} min ({100 * s / total:.0f}%)" for p, s in
                      sorted(split.items(), key=lambda kv: -kv[1]))
    return f"Time, all steps of the run from scratch: {total / 60:.1f} min = {parts}."


def recipe_note(steps) -> str:
    """Which recipe versions (data/keys.py RECIPES) made the table's steps, each with its steps: a table that
    spans several days of code says what made its rows (a step of another version is made again, never reused)."""
    by: dict[str, list[str]] = {}
    for name, made_by in sorted(steps.recipes.items()):
        by.setdefault(made_by, []).append(name)
    return "Made by recipe versions: " + "; ".join(f"{r} ({len(names)} steps)" for r, names in sorted(by.items())) \
        + "." if by else ""
