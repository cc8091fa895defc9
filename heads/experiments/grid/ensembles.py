"""`cli grid --ensemble K`: score ensembles of a grid's best configurations, one per seed.

Ensemble K of seed s is the mean L1 energy (heads.artefacts.head.EnsembleHead) of the seed-s heads of the K best l1
configurations of the leaderboard (same ranking as `GRID#rank=K`, dev only; configurations on another
store array than the best one's are left out, since an ensemble's heads share their input). Each is scored
like a head (dev, test, transfer and selection sets), and the K row reports mean ± std over seeds and the
CI of that mean, as for single heads.
"""
from __future__ import annotations

import numpy as np
import polars as pl
import torch

from headstore.data.files import atomic_write_json
from headstore.heads.artefacts.files import ensemble_groups, load_grid_head
from headstore.heads.evaluation.evaluate import PREFIX, embedder, evaluate_split, primary_metric
from headstore.heads.experiments.grid.leaderboard import _ci
from headstore.heads.artefacts.head import EnsembleHead, Head
from headstore.heads.kinds import Task


def score_ensembles(out, frame: pl.DataFrame, task: Task, features: dict[str, torch.Tensor], transfer: dict,
                    selection, ks: tuple[int, ...], split_of) -> tuple[list[dict], list[dict]]:
    """(one aggregated row per K, one row per K and seed). `features`: raw features per array;
    `transfer`: name -> out-of-domain task; `split_of(task)`: the split a transfer set is scored on."""
    groups = ensemble_groups(frame)
    if not groups:
        return [], []
    seeds = sorted(set.intersection(*[set(g["seed"].to_list()) for g in groups]))
    X = features[groups[0]["array"][0]]
    metric = primary_metric(task.kind, "l1")
    rows, per_seed = [], []
    for k in sorted(set(ks)):
        if k > len(groups):
            print(f"ensemble of {k}: the grid has only {len(groups)} l1 configurations; skipped")
            continue
        items, recs = [], []
        for seed in seeds:
            members = []
            for g in groups[:k]:
                hid = g.filter(pl.col("seed") == seed)["head_id"][0]
                members.append(Head(*load_grid_head(out, id=hid), source=f"{out}#id={hid}"))
            for m in members:  # members load on the CPU; scored where X is
                m.model, m.normalizer = m.model.to(X.device), m.normalizer.to(X.device)
            ens = EnsembleHead(members)
            embed = embedder(ens.model, X)
            rec = {"k": k, "seed": seed, "head_ids": [m.config["grid"]["head_id"] for m in members]}
            for split in ("dev", "test"):
                if split in task.eval_sets:
                    res, it = evaluate_split(task, split, embed, ("l1",))
                    rec[f"{split}_primary"] = res[0][metric]
                    if split == "test":
                        items.append(np.asarray(it[0][PREFIX["l1"]]))
            for name, t in transfer.items():
                res, _ = evaluate_split(t, split_of(t), embed, ("l1",))
                rec[f"ood_{name}"] = res[0][primary_metric(t.kind, "l1")]
            if selection:
                loss, per_set = selection.losses(embed, "l1")
                rec["sel_loss"] = float(loss[0])
            recs.append(rec)
        per_seed += recs
        row = {"config": f"top {k}", "k": k, "seeds": len(recs)}
        for col in [c for c in recs[0] if c.endswith("_primary") or c.startswith("ood_") or c == "sel_loss"]:
            vals = np.array([r[col] for r in recs], dtype=float)
            name = col[:-len("_primary")] if col.endswith("_primary") else col
            if name in ("dev", "test"):
                row[f"{name}_mean"], row[f"{name}_std"] = float(vals.mean()), float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
            else:
                row[name] = float(vals.mean())
        if items:
            row["test_ci_lo"], row["test_ci_hi"] = _ci(task, items)
        rows.append(row)
    return rows, per_seed


def write_ensembles(out, rows: list[dict], per_seed: list[dict]) -> None:
    atomic_write_json(out / "ensembles.json", {"rows": rows, "per_seed": per_seed})
