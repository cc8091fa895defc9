"""Grid results -> a leaderboard: seeds aggregated (mean ± std), selection on dev, test reported once,
a bootstrap 95% CI of the reported number (the mean over seeds of the primary metric; queries or pairs
resampled, paired across seeds and with the gold), the frozen baseline in every table, and PNG plots."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl
import torch
from tabulate import tabulate

from headstore.data.files import atomic_write_text
from headstore.heads.artefacts.files import ranked_configs
from headstore.heads.experiments.grid.plots import plot_best_curves, plot_by_setting
from headstore.heads.experiments.grid.seen_columns import baseline_columns, group_columns, part_masks
from headstore.heads.experiments.grid.seen_columns import headers as seen_headers, legend as seen_legend
from headstore.heads.kinds import KINDS, Task, kind_of

N_BOOT = 1000  # bootstrap resamples for the 95% CIs
TOP = 15  # configurations listed in the leaderboard


def _ci(task: Task, items: list[np.ndarray], split: str = "test") -> tuple[float, float]:
    """CI of the reported number: the mean over seeds of the primary metric (one item array per seed), by the
    task kind's bootstrap (IR: per-query values; STS: the mean over seeds of Spearman(-E_seed, gold), each
    resample taking the same pairs for every seed and the gold; pairs: the same with ROC AUC)."""
    return tuple(kind_of(task).ci(task, split, np.stack(items), n_boot=N_BOOT))  # (S, n) items


def _group_cis(task: Task, groups: list[pl.DataFrame]) -> list[tuple[float, float] | None]:
    """The test CI of every configuration whose rows all kept their test items (None: not tested), computed on
    torch's compute threads at once (numpy's array passes release the GIL; each CI's numbers are its own)."""
    items = [[np.asarray(json.loads(x)) for x in g["test_items"]]
             if "test_items" in g.columns and g["test_items"].null_count() == 0 else None for g in groups]
    todo = [i for i, it in enumerate(items) if it is not None]
    out: list[tuple[float, float] | None] = [None] * len(groups)
    for i, ci in zip(todo, _cis(task, [items[i] for i in todo])):
        out[i] = ci
    return out


def _cis(task: Task, items: list[list[np.ndarray]]) -> list[tuple[float, float]]:
    """`_ci` of each entry of `items` (one item array per seed), on torch's compute threads at once."""
    with ThreadPoolExecutor(max_workers=max(1, min(torch.get_num_threads(), len(items)))) as pool:
        return list(pool.map(lambda it: _ci(task, it), items))


def aggregate(frame: pl.DataFrame, task: Task) -> tuple[pl.DataFrame, list[str]]:
    """One row per configuration (all settings but the seed): dev/test mean ± std over seeds, test CI."""
    groups, keys = ranked_configs(frame)
    ok = frame.filter(pl.col("status") == "ok")
    varied = [c for c in keys if ok[c].n_unique() > 1]
    if not groups:
        return ok, varied
    rows, masks = [], part_masks(task)
    cis = _group_cis(task, groups)
    for g, ci in zip(groups, cis):
        r = {k: g[k][0] for k in keys}
        r["seeds"] = g.height
        for split in ("dev", "test"):
            col = f"{split}_primary"
            if col in g.columns and g[col].null_count() < g.height:
                vals = g[col].drop_nulls().to_numpy()
                r[f"{split}_mean"], r[f"{split}_std"] = float(vals.mean()), float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
        if ci is not None:
            r["test_ci_lo"], r["test_ci_hi"] = ci
        for col in [c for c in g.columns if c.startswith(("ood_", "sel_")) and c.endswith(("_primary", "_loss"))]:
            vals = g[col].drop_nulls().to_numpy()
            r[col[:-len("_primary")] if col.endswith("_primary") else col] = float(vals.mean()) if len(vals) else None
        r.update(group_columns(g, masks))  # seen / unseen dev and test (heads.experiments.grid.seen_columns)
        r["train_seconds"] = float(g["train_seconds"].sum())
        r["head_ids"] = ",".join(g["head_id"].to_list())
        rows.append(r)
    return pl.DataFrame(rows, infer_schema_length=None), varied


def _baseline_rows(task: Task, baselines: dict) -> list[dict]:
    out, masks = [], part_masks(task)
    b = baselines.get("features") or next(iter(baselines.values()))
    primaries = [k.primary_metric(e) for k in KINDS.values() for e in ("cosine", "l1")]
    energies = (("cosine", "cosine"), ("manhattan", "l1"))
    cis = _cis(task, [[np.asarray(b["test"]["items"][prefix])] for prefix, _ in energies]) if "test" in b else []
    for i, (prefix, energy) in enumerate(energies):
        key = kind_of(task).primary_metric(energy)
        row = {"config": f"frozen baseline ({prefix})"}
        for split in ("dev", "test"):
            if split in b:
                row[f"{split}_mean"] = b[split]["metrics"][key]
        for k, v in b.items():
            if k.startswith("ood_"):
                m = v["metrics"]
                row[k] = next((m[x] for x in primaries if x in m and prefix in x), None)
        if cis:
            row["test_ci_lo"], row["test_ci_hi"] = cis[i]
        out.append(row | baseline_columns(b, prefix, masks))
    return out


def _fmt(v, digits=4) -> str:
    return "" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.{digits}f}"


def _ci_text(r: dict) -> str:
    if _fmt(r.get("test_ci_lo")) == "" and _fmt(r.get("test_ci_hi")) == "":
        return NOT_TESTED
    return f"[{_fmt(r.get('test_ci_lo'))}, {_fmt(r.get('test_ci_hi'))}]"


NOT_TESTED = "–"  # a configuration whose heads were not ranked on test (cli grid --test-scope)


def _mean_std(r: dict) -> str:
    if _fmt(r.get("test_mean")) == "":
        return NOT_TESTED
    return f"{_fmt(r.get('test_mean'))} ± {_fmt(r.get('test_std'))}"


def _markdown(rows: list[list], headers: list[str]) -> str:
    """A GitHub-flavoured markdown table; cells are shown as given (already formatted)."""
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def leaderboard_markdown(agg: pl.DataFrame, varied: list[str], task: Task, baselines: dict, frame: pl.DataFrame,
                         ensembles: list[dict] | None = None) -> str:
    metric = frame["primary"].drop_nulls()[0] if "primary" in frame.columns and frame["primary"].drop_nulls().len() else "primary"
    lines = [f"# Leaderboard: {task.name} ({task.kind})", "",
             f"Selected on dev ({task.dev_note or 'the dataset dev split'}); test reported once. "
             f"Evaluation: {task.evaluation or task.kind}. "
             f"Primary metric: `{metric}` (head energy); mean ± std over seeds; 95% bootstrap CI (scipy, "
             f"percentile) of that mean over seeds, resampling {kind_of(task).items_name} "
             "(paired across seeds). "
             "Rank K's best-dev seed loads as `headstore.Head.load(\"<this dir>#rank=K\")` and exports with "
             "`cli export --grid <this dir> --rank K`.", ""]
    if "dev_ranked" in frame.columns and (frame["dev_ranked"] == "candidates").any():
        lines += ["Dev ranked on candidates (each dev query's frozen top pool_k and the judged documents: the corpus "
                  "is above exact_max); test ranked exactly over the whole corpus"
                  + (f", for each stack's dev-best configuration only ({NOT_TESTED}: not tested; --test-scope)."
                     if "test_scored" in frame.columns and not frame["test_scored"].fill_null(True).all() else "."), ""]
    ood = sorted(c for c in agg.columns if c.startswith("ood_"))
    sel = "sel_loss" in agg.columns and agg["sel_loss"].null_count() < agg.height
    if sel:
        delta = frame["sel_delta"].drop_nulls()[0]
        sets = sorted(c[4:] for c in agg.columns if c.startswith("sel_") and c != "sel_loss")
        lines[-2] += (f" Ranked with out-of-domain selection on the dev splits of {', '.join(sets)}: configurations "
                      f"whose worst out-of-domain dev loss (frozen cosine minus head, mean over seeds) is <= {delta} "
                      "first, by dev; then the rest by least loss ('OOD dev loss').")
    parts = [(c, h) for c, h in seen_headers(part_masks(task)) if c in agg.columns]  # seen / unseen columns
    lines[-2] += seen_legend(dict(parts))
    headers = ["rank", "config", *varied, "seeds", "dev", *(["OOD dev loss"] if sel else []), "test mean ± std",
               "test 95% CI", *[h for _, h in parts], *[f"OOD {c[4:]}" for c in ood]]
    rows = []
    for b in _baseline_rows(task, baselines):
        rows.append(["–", b["config"], *[""] * len(varied), "–", _fmt(b.get("dev_mean")), *([""] if sel else []),
                     _fmt(b.get("test_mean")), _ci_text(b), *[_fmt(b.get(c)) for c, _ in parts],
                     *[_fmt(b.get(c)) for c in ood]])
    for i, r in enumerate(agg.head(TOP).iter_rows(named=True)):
        rows.append([i + 1, "head", *[str(r[v]) for v in varied], r["seeds"], _fmt(r.get("dev_mean")),
                     *([_fmt(r.get("sel_loss"))] if sel else []),
                     _mean_std(r), _ci_text(r), *[_fmt(r.get(c)) for c, _ in parts],
                     *[_fmt(r.get(c)) for c in ood]])
    lines.append(_markdown(rows, headers))
    if ensembles:
        lines += _ensembles_section(ensembles, sel, ood)
    if "loss" in agg.columns and agg["loss"].n_unique() > 1:
        lines += _best_per_loss_section(agg, varied, ood)
    lines += _failed_section(frame)
    return "\n".join(lines) + "\n"


def _ensembles_section(ensembles: list[dict], sel: bool, ood: list[str]) -> list[str]:
    """The leaderboard's ensembles (`--ensemble K`) as a table, with the OOD columns of the heads' table."""
    lines = ["", "## Ensembles (mean L1 energy of the K best l1 configurations, one ensemble per seed)", "",
             "Ensemble K of seed s averages the seed-s heads of the K best configurations above (dev only); "
             "`<this dir>#ensemble=K` loads the best-dev seed of each.", ""]
    erows = [[e["config"], e["seeds"], _fmt(e.get("dev_mean")), *([_fmt(e.get("sel_loss"))] if sel else []),
              _mean_std(e), _ci_text(e),
              *[_fmt(e.get(c)) for c in ood]] for e in ensembles]
    lines.append(_markdown(erows, ["ensemble", "seeds", "dev", *(["OOD dev loss"] if sel else []),
                                   "test mean ± std", "test 95% CI", *[f"OOD {c[4:]}" for c in ood]]))
    return lines


def _best_per_loss_section(agg: pl.DataFrame, varied: list[str], ood: list[str]) -> list[str]:
    """The dev-best configuration of each loss of the grid (`agg` is ranked: its first row per loss)."""
    lines = ["", "## Best configuration of each loss (selected on dev)", ""]
    best = []
    for loss in sorted(agg["loss"].unique().to_list()):
        r = agg.filter(pl.col("loss") == loss).row(0, named=True)
        s = ", ".join(f"{v}={r[v]}" for v in varied if v != "loss")
        best.append([loss, _fmt(r.get("dev_mean")), _mean_std(r),
                     _ci_text(r), *[_fmt(r.get(c)) for c in ood], s])
    lines.append(_markdown(best, ["loss", "dev", "test mean ± std", "test 95% CI",
                                  *[f"OOD {c[4:]}" for c in ood], "settings"]))
    return lines


def _failed_section(frame: pl.DataFrame) -> list[str]:
    """The heads not trained or failed, one line per reason with its count (none: no lines)."""
    failed = frame.filter(pl.col("status") != "ok")
    if not failed.height:
        return []
    lines = ["", f"## Not trained / failed ({failed.height})", ""]
    for r in failed.select("head_id", "loss", "status", "reason").unique("reason").iter_rows(named=True):
        n = failed.filter(pl.col("reason") == r["reason"]).height
        lines.append(f"- {r['status']} ×{n}: {r['reason']}")
    return lines


def write_report(frame: pl.DataFrame, task: Task, baselines: dict, out: Path, print_it: bool = True,
                 ensembles: list[dict] | None = None) -> str:
    if frame.is_empty():
        return ""
    agg, varied = aggregate(frame, task)
    md = leaderboard_markdown(agg, varied, task, baselines, frame, ensembles)
    atomic_write_text(out / "leaderboard.md", md)
    if not agg.is_empty():
        agg.write_csv(out / "configs.csv")
    ok = frame.filter(pl.col("status") == "ok")
    if ok.height:
        b = baselines.get("features") or next(iter(baselines.values()))
        metric = "dev_primary"
        base_key = kind_of(task).primary_metric("cosine")
        base = b.get("dev", {}).get("metrics", {}).get(base_key)
        plot_by_setting(ok.to_dicts(), [v for v in varied], metric, base, out / "by_setting.png")
        best = ok.sort("dev_primary", descending=True).head(6) if "dev_primary" in ok.columns else ok.head(6)
        curves = {f"{r['loss']} lr={r['lr']} s{r['seed']}": json.loads(r["history"]) for r in best.iter_rows(named=True)}
        plot_best_curves(curves, out / "best_curves.png")
    if print_it:
        print(md)
    return md
