"""`cli grid --soup K`: score the soup of K heads (heads.artefacts.soup) per seed, like a configuration.

Soup K of seed s: that seed's best-dev head and the K - 1 best-dev heads sharing its start, weights
averaged into one head; scored on dev, test, the transfer and the selection sets; the K row reports mean
± std over the distinct soups (seeds whose soups hold the same heads count once: `seeds` is how many differ, the std
None where one) and the CI of that mean (soups.json; `GRID#soup=K` loads the grid's own, heads.artefacts.soup).
"""
from __future__ import annotations

import numpy as np
import polars as pl

from headstore.data.files import atomic_write_json
from headstore.heads.evaluation.evaluate import PREFIX, embedder, evaluate_split, primary_metric
from headstore.heads.experiments.grid.leaderboard import _ci
from headstore.heads.kinds import Task
from headstore.heads.scoring.losses import scoring_energy
from headstore.heads.artefacts.soup import load_soup


def score_soups(out, frame: pl.DataFrame, task: Task, features, transfer: dict, selection,
                ks: tuple[int, ...], split_of) -> dict:
    """{"rows": one aggregated row per K, "per_seed": one per K and seed}; `features(array)` gives raw features."""
    ok = frame.filter(pl.col("status") == "ok")
    rows, per_seed = [], []
    for k in sorted(set(ks)):
        recs, items, made = [], [], {}
        for seed in sorted(set(ok["seed"].to_list())):
            try:
                model, norm, config = load_soup(out, k, seed)
            except ValueError as err:
                print(f"soup of {k}, seed {seed}: {err}; skipped")
                continue
            same = made.setdefault(frozenset(config["soup"]["head_ids"]), seed)
            if same != seed:  # heads that start alike whatever their seed (linear residual heads) soup alike
                print(f"soup of {k}, seed {seed}: the same heads as seed {same}'s soup; counted once")
                continue
            energy = scoring_energy(config["train"]["loss"], config["train"]["energy"])  # as its heads were trained
            raw = features(config.get("array", "features"))
            X = norm.to(raw.device)(raw)
            embed = embedder(model.to(raw.device), X)  # loaded on the CPU; scored where the features are
            rec = {"k": k, "seed": seed, "head_ids": config["soup"]["head_ids"]}
            for split in ("dev", "test"):
                if split in task.eval_sets:
                    res, it = evaluate_split(task, split, embed, (energy,))
                    rec[f"{split}_primary"] = res[0][primary_metric(task.kind, energy)]
                    if split == "test":
                        items.append(np.asarray(it[0][PREFIX[energy]]))
            for name, t in transfer.items():
                res, _ = evaluate_split(t, split_of(t), embed, (energy,))
                rec[f"ood_{name}"] = res[0][primary_metric(t.kind, energy)]
            if selection:
                rec["sel_loss"] = float(selection.losses(embed, energy)[0][0])
            recs.append(rec)
        if not recs:
            continue
        per_seed += recs
        row = {"config": f"soup of {k}", "k": k, "seeds": len(recs), "seeds_tried": len(set(ok["seed"].to_list()))}
        for col in [c for c in recs[0] if c.endswith("_primary") or c.startswith("ood_") or c == "sel_loss"]:
            vals = np.array([r[col] for r in recs], dtype=float)
            name = col[:-len("_primary")] if col.endswith("_primary") else col
            row[f"{name}_mean"] = float(vals.mean())
            row[f"{name}_std"] = float(vals.std(ddof=1)) if len(vals) > 1 else None  # one soup: no spread known
        if items:
            row["test_ci_lo"], row["test_ci_hi"] = _ci(task, items)
        rows.append(row)
        means = ", ".join(f"{c} {v:.4f}" for c, v in row.items() if isinstance(v, float) and c.endswith("_mean"))
        print(f"soup of {k} ({len(recs)} distinct of {row['seeds_tried']} seeds): {means}")
    result = {"rows": rows, "per_seed": per_seed}
    atomic_write_json(out / "soups.json", result)
    return result
