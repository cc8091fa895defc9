"""The answer of `cli compare`: per setup and dataset, mean +- std over seeds, a 95% bootstrap CI, and the
paired difference from frozen + head with its CI; forgetting, parameters, seconds and peak memory.

CIs come from `heads.scoring.metrics.bootstrap_ci` (percentile bootstrap over the test queries or pairs,
paired across seeds): a setup's CI is that of its seed-mean figure (IR: the mean over seeds and queries of
nDCG@10; STS: the mean over seeds of Spearman). A paired difference resamples the same queries / pairs for
the setup and for frozen + head, pooled over each one's seeds (the difference of the two seed-mean
figures), so query-to-query spread common to both cancels; it "excludes 0" when its CI does.
Written: compare.json (everything, per seed), compare.md (three tables), compare.png (the picture:
`plot_gain_vs_change`), and a short table for the terminal.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tabulate import tabulate

from headstore.data.files import atomic_write_text
from headstore.heads.experiments.compare_report import dataset_name
from headstore.heads.experiments.compare_setups import REFERENCE, SETUPS
from headstore.heads.experiments.plots import metric_family, plot_gain_vs_change
from headstore.heads.scoring.metrics import bootstrap_ci


def statistic_of(metric: str) -> str:
    """bootstrap_ci's statistic for a primary metric: rank statistics need the gold, IR metrics are means."""
    for name in ("spearman", "auc", "pearson"):
        if metric.startswith(name):
            return name
    return "mean"


def figure(per_seed: list[float], items: np.ndarray, gold, statistic: str, n_boot: int) -> dict:
    """mean +- std over seeds and the CI of the seed mean, from items (S, n)."""
    lo, hi = bootstrap_ci(items, n_boot=n_boot, gold=gold, statistic=statistic)
    return {"mean": float(np.mean(per_seed)), "std": float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else 0.0,
            "ci": [lo, hi], "per_seed": [float(v) for v in per_seed]}


def paired(per_seed: list[float], items: np.ndarray, ref_seed: list[float], ref_items: np.ndarray, gold,
           statistic: str, n_boot: int) -> dict:
    """The setup's seed-mean figure minus the reference's, and its paired bootstrap CI (same items)."""
    if statistic == "mean":  # the difference of means is the mean of the per-item differences
        lo, hi = bootstrap_ci(items.mean(0) - ref_items.mean(0), n_boot=n_boot)
    else:
        lo, hi = bootstrap_ci(items, n_boot=n_boot, gold=gold, statistic=statistic, minus=ref_items)
    return {"diff": float(np.mean(per_seed) - np.mean(ref_seed)), "ci": [lo, hi], "excludes_zero": lo > 0 or hi < 0}


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
    key = "head" if setup.head is not None else "baseline"
    recs = [evals[b.encoder, seed, ds] for b, seed in instances]
    metric = recs[0]["metric" if setup.head is not None else "baseline_metric"]
    per_seed = [r["value" if setup.head is not None else "baseline"] for r in recs]
    items = np.stack([np.asarray(r["items"][key], dtype=np.float64) for r in recs])  # (S, n)
    return metric, per_seed, items, recs[0]["gold"]


def build_rows(cfg, built: dict, evals: dict, mlm: dict, steps) -> list[dict]:
    """One dict per setup (SETUPS order): figures and paired differences per dataset, forgetting, cost."""
    datasets = [dataset_name(d) for d in [cfg.in_domain, *cfg.out_of_domain]]
    names = [s for s in SETUPS if s in cfg.setups or s == REFERENCE]
    seeds_of = {name: _instances(SETUPS[name], built) for name in names}
    ref = {ds: _values(SETUPS[REFERENCE], seeds_of[REFERENCE], evals, ds) for ds in datasets}
    rows = []
    for name in names:
        setup = SETUPS[name]
        row = {"setup": name, "label": setup.label, "encoder": setup.encoder, "head": setup.head,
               "seeds": [s for _, s in seeds_of[name]], "datasets": {}}
        for ds in datasets:
            metric, per_seed, items, gold = _values(setup, seeds_of[name], evals, ds)
            stat = statistic_of(metric)
            block = {"metric": metric, **figure(per_seed, items, gold, stat, cfg.n_boot)}
            if name != REFERENCE:
                _, ref_seed, ref_items, _ = ref[ds]
                block["vs_frozen_head"] = paired(per_seed, items, ref_seed, ref_items, gold, stat, cfg.n_boot)
            row["datasets"][ds] = block
        row.update(_cost(setup, seeds_of[name], steps))
        row["mlm_loss"] = _forgetting(setup, seeds_of[name], mlm)
        rows.append(row)
    return rows


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
        "## Figures (mean ± std over seeds, [95% bootstrap CI of the seed mean])",
        tabulate(figures, headers=fig_head, tablefmt="github", disable_numparse=True),
        "## Paired difference from frozen + head (Δ, [95% CI]; * = the CI excludes 0)",
        tabulate(diffs, headers=["setup", *datasets], tablefmt="github", disable_numparse=True),
        "## Forgetting and cost",
        tabulate(cost, headers=["setup", "MLM loss general", "MLM loss in-domain held-out", "trainable parameters",
                                "seconds (from scratch)", "peak MB"], tablefmt="github", disable_numparse=True),
        _notes(cfg)])
    return terminal, md


def _notes(cfg) -> str:
    return (f"In-domain: {cfg.in_domain} (test split); out of domain: {', '.join(cfg.out_of_domain) or 'none'} "
            "(test split, or the only split" + ("; pairs / queries using an in-domain text dropped" if
                                               cfg.ood_exclude_overlap else "") + "). "
            f"Seeds {list(cfg.seeds)}" + (f", encoders tuned at the first {cfg.tune_seeds}" if cfg.tune_seeds else "")
            + f"; {cfg.n_boot} bootstrap resamples. seconds: what producing the setup cost from scratch (featurize, "
            "adapt, train-head, finetune; evaluation excluded), mean over seeds; peak MB: the largest resident memory "
            "of the compare process during one of its steps. MLM loss: masked-token cross-entropy, the same masks "
            "for every model, under the probe head trained on the frozen encoder (the MLM-adapted encoder: its own "
            "head); general = wikitext-2 lines, in-domain = texts held out of adaptation.")


def adaptation_note(steps) -> str:
    """One line: each MLM training run's steps, final loss and whether it settled (compare.settled, computed
    from the loss curve in its record)."""
    from headstore.heads.experiments.compare_setups import SETTLE_CHANGE, settled

    runs = {n: r for n, r in steps.results.items() if n == "mlm-probe" or n.startswith("adapt-")}
    parts = []
    for n, r in runs.items():
        ok, drop = settled(r.get("losses") or [])
        parts.append(f"{n}: {r['steps']} steps, loss {r['last_loss_mean10']:.3f}, "
                     + ("settled" if ok else "NOT settled") + ("" if drop is None else f" (second half -{100 * drop:.1f}%)"))
    if not parts:
        return ""
    return (f"MLM runs (settled = the second half of the run lowered the training loss by < {100 * SETTLE_CHANGE:.0f}%): "
            + "; ".join(parts) + ".")


def write_report(cfg, out: Path, built: dict, evals: dict, mlm: dict, steps) -> str:
    """compare.json, compare.md, compare.png; returns the terminal table."""
    rows = build_rows(cfg, built, evals, mlm, steps)
    terminal, md = tables(cfg, rows)
    note = adaptation_note(steps)
    md, terminal = (md + "\n\n" + note, terminal + "\n\n" + note) if note else (md, terminal)
    title = f"# compare: {cfg.model}, heads trained on {dataset_name(cfg.in_domain)}\n\n![in-domain gain against " \
            "out-of-domain change](compare.png)\n\n"
    atomic_write_text(out / "compare.md", title + md + "\n")
    atomic_write_text(out / "compare.json", json.dumps({
        "rows": rows, "model": cfg.model, "in_domain": cfg.in_domain, "out_of_domain": list(cfg.out_of_domain),
        "seeds": list(cfg.seeds), "tune_seeds": cfg.tune_seeds, "n_boot": cfg.n_boot, "reference": REFERENCE,
        "step_seconds": steps.seconds, "step_peak_mb": steps.peak_mb}, indent=1, default=float))
    plot_gain_vs_change(rows, out / "compare.png")
    return terminal + "\n\n" + _notes(cfg) + "\n"
