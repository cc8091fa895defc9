"""The answer of `cli compare`: per setup and dataset, mean +- std over seeds, a 95% bootstrap CI, and the
paired difference from frozen + head with its CI; forgetting, parameters, seconds and peak memory.

CIs are two-level (hierarchical) bootstraps (`heads.scoring.bootstrap`): each resample draws
S seeds with replacement from the setup's S seeds AND the test queries / pairs with replacement; its value
is the mean over the drawn seeds of each seed's statistic on the drawn items, the statistic being the one
the task kind names for its primary metric (`TaskKind.statistic`: the mean of per-query nDCG@10, Spearman
against the gold scores, AUC against the labels). So a CI holds the spread between training runs as well
as between queries: "excludes 0" speaks for the method, not for one trained model.
A paired difference is paired by seed and by item: a tuned row at seed s started from frozen + head at seed
s, so its seed-s figure is set against frozen + head's seed-s figure, and a resample draws seeds from the
seeds both have (the row's `seeds`) and the same items for both. A row whose value does not depend on the
seed (the frozen encoder's cosine: one instance) is set against every seed of frozen + head (broadcast:
its difference at seed s is its figure minus frozen + head's at s, seeds drawn from frozen + head's).
The figure's mean and std are over the row's seeds; the difference is the mean of the per-seed differences.
Written: compare.json (everything, per seed), compare.md (three tables), compare.png (the picture:
`plot_gain_vs_change`), and a short table for the terminal.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tabulate import tabulate

from headstore.data.files import atomic_write_text
from headstore.heads.experiments.compare.parts import parts_section, split_evals
from headstore.heads.experiments.compare.report import dataset_name
from headstore.heads.experiments.compare.notes import (adaptation_note, method, recipe_note, time_note, time_split,
                                                      tuning_note)
from headstore.heads.experiments.compare.setups import REFERENCE, SETUPS
from headstore.heads.experiments.grid.plots import metric_family, plot_gain_vs_change
from headstore.heads.kinds import kind_of_metric
from headstore.heads.scoring.bootstrap import item_statistics, seed_interval


def statistic_of(metric: str) -> str:
    """The bootstrap statistic of a primary metric: its task kind's (the kinds registry)."""
    return kind_of_metric(metric).statistic


def figure(per_seed: list[float], boot: np.ndarray) -> dict:
    """mean +- std over seeds and the two-level CI of the seed mean, from boot (S, B): each seed's statistic on
    the item resamples (`item_statistics`)."""
    lo, hi = seed_interval(boot)
    return {"mean": float(np.mean(per_seed)), "std": float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else 0.0,
            "ci": [lo, hi], "per_seed": [float(v) for v in per_seed]}


def paired(per_seed: list[float], boot: np.ndarray, ref_seed: list[float], ref_boot: np.ndarray) -> dict:
    """The mean over seeds of the setup's figure minus the reference's at the same seed, and its two-level CI:
    seeds resampled as pairs, items as pairs (both boots on the same item resamples). Row s of each side is
    one seed (`by_seed`)."""
    lo, hi = seed_interval(boot - ref_boot)
    diff = float(np.mean(np.subtract(per_seed, ref_seed)))
    return {"diff": diff, "ci": [lo, hi], "excludes_zero": lo > 0 or hi < 0}


def by_seed(seeds: list, per_seed: list, boot: np.ndarray, ref: tuple, broadcast: bool) -> tuple:
    """(seeds, per_seed, boot, ref_seed, ref_boot) with row s of each side at the same seed: the seeds both
    have, or, for a row that does not depend on the seed (`broadcast`), its one instance against every
    reference seed. ref: (seeds, per_seed, boot) of the reference."""
    ref_seeds, ref_per_seed, ref_boot = ref
    if broadcast:
        assert len(seeds) == 1, seeds
        n = len(ref_seeds)
        return list(ref_seeds), list(per_seed) * n, np.repeat(boot, n, axis=0), list(ref_per_seed), ref_boot
    at = {s: i for i, s in enumerate(ref_seeds)}
    common = [i for i, s in enumerate(seeds) if s in at]
    assert common, (seeds, ref_seeds)  # frozen + head runs at every seed
    j = [at[seeds[i]] for i in common]
    return ([seeds[i] for i in common], [per_seed[i] for i in common], boot[common],
            [ref_per_seed[k] for k in j], ref_boot[j])


def _instances(setup, built: dict) -> list[tuple]:
    """(encoder instance, seed) pairs a row averages over: every seed for a row with a head; for a no-head
    row each distinct encoder once (the frozen encoder's cosine is the same at every seed, and so is an
    encoder tuned at fewer seeds than the heads)."""
    pairs = [(b, s) for s, b in built[setup.encoder].items()]
    if setup.head is not None:
        return pairs
    first = {}
    for b, s in pairs:
        first.setdefault(b.seed, (b, s))
    return list(first.values())


def _values(setup, instances, evals, ds: str):
    """(metric, per-seed figures, per-item values (S, n), gold) of one row on one dataset."""
    key = "head" if setup.head is not None else "baseline"
    recs = [evals[b.encoder, seed, ds] for b, seed in instances]
    metric = recs[0]["metric" if setup.head is not None else "baseline_metric"]
    per_seed = [r["value" if setup.head is not None else "baseline"] for r in recs]
    items = np.stack([np.asarray(r["items"][key], dtype=np.float64) for r in recs])  # (S, n)
    return metric, per_seed, items, recs[0]["gold"]


def _dataset(names, seeds_of, evals, ds: str, n_boot: int) -> dict:
    """{setup: (metric, per-seed figures, per-seed statistics on the item resamples (S, n_boot))} on one
    dataset: every row's seeds on the same resamples of its items, drawn (and the gold ranked) once."""
    vals = {name: _values(SETUPS[name], seeds_of[name], evals, ds) for name in names}
    statistic = statistic_of(vals[REFERENCE][0])
    assert all(statistic_of(v[0]) == statistic for v in vals.values()), {n: v[0] for n, v in vals.items()}
    stacked = np.concatenate([v[2] for v in vals.values()])  # (all rows' seeds, n): the same items
    gold = None if statistic == "mean" else vals[REFERENCE][3]
    boot = item_statistics(stacked, n_boot, gold=gold, statistic=statistic)
    parts = np.split(boot, np.cumsum([len(v[1]) for v in vals.values()])[:-1])
    return {name: (v[0], v[1], part) for (name, v), part in zip(vals.items(), parts)}


def _seed_independent(setup, instances) -> bool:
    """A row whose value is the same at every seed: no head, and an encoder no seed made (the frozen one)."""
    return setup.head is None and all(b.seed is None for b, _ in instances)


def build_rows(cfg, built: dict, evals: dict, mlm: dict, steps) -> list[dict]:
    """One dict per setup (SETUPS order): figures and paired differences per dataset, forgetting, cost."""
    datasets = [dataset_name(d) for d in [cfg.in_domain, *cfg.out_of_domain]]
    names = [s for s in SETUPS if s in cfg.setups or s == REFERENCE]
    seeds_of = {name: _instances(SETUPS[name], built) for name in names}
    part_evals, parts = split_evals(evals, datasets[0])  # the in-domain queries, seen and unseen
    values = {ds: _dataset(names, seeds_of, {**evals, **part_evals}, ds, cfg.n_boot) for ds in datasets + parts}
    rows = []
    for name in names:
        setup = SETUPS[name]
        seeds = [s for _, s in seeds_of[name]]
        row = {"setup": name, "label": setup.label, "encoder": setup.encoder, "head": setup.head,
               "seeds": seeds, "datasets": {ds: _block(name, seeds_of, values[ds]) for ds in datasets}}
        if parts:
            row["parts"] = {ds: {**_block(name, seeds_of, values[ds]), "n": part_evals[next(
                k for k in part_evals if k[2] == ds)]["n_scored"]} for ds in parts}
        row.update(_cost(setup, seeds_of[name], steps))
        row["mlm_loss"] = _forgetting(setup, seeds_of[name], mlm)
        rows.append(row)
    return rows


def _block(name: str, seeds_of: dict, values: dict) -> dict:
    """One row's figure on one dataset (values: `_dataset`'s) and, but for the reference, its paired
    difference from the reference seed by seed."""
    setup, seeds = SETUPS[name], [s for _, s in seeds_of[name]]
    metric, per_seed, boot = values[name]
    block = {"metric": metric, **figure(per_seed, boot)}
    if name != REFERENCE:
        ref_seeds = [s for _, s in seeds_of[REFERENCE]]
        paired_seeds, *sides = by_seed(seeds, per_seed, boot, (ref_seeds, *values[REFERENCE][1:]),
                                       _seed_independent(setup, seeds_of[name]))
        block["vs_frozen_head"] = {**paired(*sides), "seeds": paired_seeds}
    return block


def _cost(setup, instances, steps) -> dict:
    """Trainable parameters, seconds (mean over seeds of the steps it took from scratch) and peak memory."""
    seconds = [sum(steps.seconds[n] for n in b.steps) for b, _ in instances]
    peaks = [steps.peak_mb.get(n) for b, _ in instances for n in b.steps]
    peaks = [p for p in peaks if p is not None]
    return {"trainable_parameters": int(instances[0][0].trainable[setup.head]), "seconds": float(np.mean(seconds)),
            "peak_mb": max(peaks) if peaks else None}


def _forgetting(setup, instances, mlm: dict) -> dict | None:
    if not mlm:
        return None
    keys = [("base", None)] if setup.encoder == "base" else sorted({(setup.encoder, b.seed) for b, _ in instances})
    out = {}
    for part in ("general", "in_domain"):
        vals = [mlm[k][part] for k in keys if part in mlm.get(k, {})]
        if vals:
            out[part] = {"mean": float(np.mean(vals)), "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0,
                         "per_seed": vals}
    return out


def _pm(block: dict, digits: int = 4) -> str:
    return f"{block['mean']:.{digits}f} ± {block['std']:.{digits}f}"


def _ci(ci) -> str:
    return f"[{ci[0]:.4f}, {ci[1]:.4f}]"


def _diff(block: dict) -> str:
    d = block.get("vs_frozen_head")
    if d is None:
        return "(reference)"
    return f"{d['diff']:+.4f} {_ci(d['ci'])}{' *' if d['excludes_zero'] else ''}"


def _mlm(row: dict, part: str) -> str:
    m = (row.get("mlm_loss") or {}).get(part)
    return "-" if m is None else f"{m['mean']:.3f} ± {m['std']:.3f}"


def tables(cfg, rows: list[dict]) -> tuple[str, str]:
    """(the terminal's short table, compare.md's body)."""
    datasets = list(rows[0]["datasets"])
    ind, ood = datasets[0], datasets[1:]
    short = [[r["label"], len(r["seeds"]), _pm(r["datasets"][ind]), _diff(r["datasets"][ind]),
              *[_diff(r["datasets"][d]) for d in ood], _mlm(r, "general"), f"{r['trainable_parameters']:,}",
              f"{r['seconds']:.0f}"] for r in rows]
    head = ["setup", "seeds", f"{ind} (in-domain)", "Δ vs frozen+head [95% CI]", *[f"Δ {d} (OOD)" for d in ood],
            "MLM loss", "trainable", "s"]
    terminal = tabulate(short, headers=head, tablefmt="simple", disable_numparse=True)
    figures = [[r["label"], len(r["seeds"]), *[f"{_pm(r['datasets'][d])} {_ci(r['datasets'][d]['ci'])}" for d in datasets]]
               for r in rows]
    metric = {d: metric_family(rows[0]["datasets"][d]["metric"]) for d in datasets}
    fig_head = ["setup", "seeds", *[f"{d} ({metric[d]}{', in-domain' if d == ind else ''})" for d in datasets]]
    diffs = [[r["label"], *[_diff(r["datasets"][d]) for d in datasets]] for r in rows]
    cost = [[r["label"], _mlm(r, "general"), _mlm(r, "in_domain"), f"{r['trainable_parameters']:,}",
             f"{r['seconds']:.0f}", "-" if r["peak_mb"] is None else f"{r['peak_mb']:.0f}"] for r in rows]
    md = "\n\n".join([
        "## Figures (mean ± std over seeds, [95% two-level bootstrap CI of the seed mean])",
        tabulate(figures, headers=fig_head, tablefmt="github", disable_numparse=True),
        "## Paired difference from frozen + head, seed by seed (Δ, [95% two-level CI]; * = the CI excludes 0)",
        tabulate(diffs, headers=["setup", *datasets], tablefmt="github", disable_numparse=True),
        *[x for x in [parts_section(rows, ind, lambda b: f"{_pm(b)} {_ci(b['ci'])}", _diff)] if x],
        "## Forgetting and cost",
        tabulate(cost, headers=["setup", "MLM loss general", "MLM loss in-domain held-out", "trainable parameters",
                                "seconds (from scratch)", "peak MB"], tablefmt="github", disable_numparse=True),
        method(cfg)])
    return terminal, md


def write_report(cfg, out: Path, built: dict, evals: dict, mlm: dict, steps) -> str:
    """compare.json, compare.md, compare.png; returns the terminal table."""
    rows = build_rows(cfg, built, evals, mlm, steps)
    terminal, md = tables(cfg, rows)
    split = time_split(steps)
    notes = [n for n in (adaptation_note(steps), tuning_note(built), time_note(split), recipe_note(steps)) if n]
    md, terminal = "\n\n".join([md, *notes]), "\n\n".join([terminal, *notes])
    title = f"# compare: {cfg.model}, heads trained on {dataset_name(cfg.in_domain)}\n\n![in-domain gain against " \
            "out-of-domain change](compare.png)\n\n"
    atomic_write_text(out / "compare.md", title + md + "\n")
    tunings = {name: {str(s): b.tuning for s, b in per_seed.items() if getattr(b, "tuning", None)}
               for name, per_seed in built.items()}
    atomic_write_text(out / "compare.json", json.dumps({
        "rows": rows, "model": cfg.model, "in_domain": cfg.in_domain, "out_of_domain": list(cfg.out_of_domain),
        "seeds": list(cfg.seeds), "tune_seeds": cfg.tune_seeds, "n_boot": cfg.n_boot, "reference": REFERENCE,
        "tunings": {k: v for k, v in tunings.items() if v}, "time_split_seconds": split,
        "step_seconds": steps.seconds, "step_peak_mb": steps.peak_mb, "step_recipes": steps.recipes}, indent=1, default=float))
    plot_gain_vs_change(rows, out / "compare.png")
    return terminal + "\n\n" + method(cfg) + "\n"
