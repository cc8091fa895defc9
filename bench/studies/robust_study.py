"""The study of issue 20 (docs/robust.md): every lever against the frozen cosine baseline, in and out of domain.

Reads the grids `examples/studies/robust/robust_study.sh` trains (the round-2 default head, the anchor, the soups, each under the
L1 and the cosine energy, 3 seeds) and, for every head, scores the strength curve a = 0, 0.1, ..., 1
(heads.training.strength) on the in-domain dev and test splits, the out-of-domain dev sets (`--select-ood`: never test)
and the out-of-domain test sets (reported, never selected on). The strength lever is a chosen per head on dev
by heads.training.selection's rule (the same as `--strength auto`). Writes per dataset a markdown table (lever x
in-domain test, each out-of-domain test; 3-seed means with the 95% CI of the in-domain mean) and JSON, and one
picture of the in-domain vs out-of-domain trade-off (the default head's strength curve and each lever as a point).

    python bench/studies/robust_study.py --store S --runs /work/runs-robust --out docs/img/robust-tradeoff.png
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import polars as pl
import torch

from headstore.featurize.store.reader import FeatureStore
from headstore.heads.artefacts.files import load_safetensors, read_results, stack_paths
from headstore.heads.evaluation.evaluate import PREFIX, embedder, evaluate_split
from headstore.heads.experiments.compare.datasets_root import datasets_root
from headstore.heads.experiments.grid.leaderboard import _ci
from headstore.heads.network.features import Normalizer, load_features
from headstore.heads.kinds import load_task, primary_metric, task_rows, without_overlap
from headstore.heads.network.model import load_heads
from headstore.heads.training.selection import DEFAULT_DELTA, load_selection
from headstore.heads.artefacts.soup import load_soup
from headstore.heads.training.strength import STRENGTHS, choose, with_strength
from robust_picture import picture  # bench/: the picture, redrawn alone from the JSON too

# dataset -> (data, out-of-domain test sets, out-of-domain dev sets: docs/l1-energy.md round 2's choice)
STUDY = {
    "scifact": ("scifact", ("cranfield", "cacm"), ("stsb", "pairs-small/trecqa_pairs.parquet")),
    "stsb": ("stsb", ("semeval-sts-2012-2016",), ("semeval-sts-2012-2016",)),
    "trecqa": ("pairs-small/trecqa_pairs.parquet", (), ()),
}
GRIDS = ("base", "anchor", "anchorstrong", "anchorgen", "soup", "query")  # <runs>/<dataset>-<grid> (examples/studies/robust/robust_study.sh)


class Scorer:
    """One dataset's tasks, features and sets; scores a stack of heads at given strengths."""

    def __init__(self, store_path: str, name: str, root: Path):
        data, ood_test, ood_dev = STUDY[name]
        self.store = FeatureStore.open(store_path)
        self.X = load_features(self.store)
        self.task = load_task(str(root / data), self.store)
        rows = task_rows(self.task)
        self.ood = {}
        for o in ood_test:  # test (or whole) split, in-domain texts dropped as --transfer does
            t, _ = without_overlap(load_task(str(root / o), self.store, for_eval=True), rows)
            self.ood[o] = (t, "test" if "test" in t.eval_sets else next(iter(t.eval_sets)))
        self.selection = load_selection(self.store, tuple(str(root / o) for o in ood_dev), self.task, self.X,
                                        DEFAULT_DELTA)

    def frozen(self) -> dict:
        """The frozen features with cosine on every split and set."""
        embed = embedder(None, self.X)
        out = {}
        for split in ("dev", "test"):
            res, items = evaluate_split(self.task, split, embed, ("cosine",))
            out[split] = res[0][primary_metric(self.task.kind, "cosine")]
            if split == "test":
                out["test_items"] = np.asarray(items[0]["cosine"])
        for o, (t, split) in self.ood.items():
            res, _ = evaluate_split(t, split, embed, ("cosine",))
            out[o] = res[0][primary_metric(t.kind, "cosine")]
        return out

    def score(self, model, norm: Normalizer, energy: str) -> list[dict]:
        """Per head of the stack: dev, test (+ items), OOD dev loss, OOD test."""
        Xn = norm(self.X)
        embed = embedder(model, Xn)
        metric = primary_metric(self.task.kind, energy)
        recs = [dict() for _ in range(model.n_heads)]
        for split in ("dev", "test"):
            res, items = evaluate_split(self.task, split, embed, (energy,))
            for h, r in enumerate(recs):
                r[split] = res[h][metric]
                if split == "test":
                    r["test_items"] = np.asarray(items[h][PREFIX[energy]])
        if self.selection:
            loss, _ = self.selection.losses(embed, energy)
            for h, r in enumerate(recs):
                r["ood_loss"] = float(loss[h])
        for o, (t, split) in self.ood.items():
            res, _ = evaluate_split(t, split, embed, (energy,))
            for h, r in enumerate(recs):
                r[o] = res[h][primary_metric(t.kind, energy)]
        return recs


def stack_curves(scorer: Scorer, grid: Path) -> list[dict]:
    """Every ok head of a grid with its strength curve (one record per a)."""
    rows = read_results(grid).filter(pl.col("status") == "ok")
    out = []
    for stack in rows["stack"].unique(maintain_order=True).to_list():
        weights, normalizer, meta = stack_paths(grid, stack)
        model = load_safetensors(weights, load_heads)
        norm = load_safetensors(normalizer, Normalizer.load)
        info = json.loads(meta.read_text())
        energy = info["train"][0]["energy"]
        curves = [[] for _ in range(model.n_heads)]
        for a in STRENGTHS:
            for h, rec in enumerate(scorer.score(with_strength(model, [a] * model.n_heads), norm, energy)):
                curves[h].append({"strength": a, **rec})
        for h, hid in enumerate(info["head_ids"]):
            row = rows.filter(pl.col("head_id") == hid).row(0, named=True)
            out.append({"row": row, "curve": curves[h], "energy": energy})
    return out


def aggregate(scorer: Scorer, label: str, recs: list[dict], ci: bool = True) -> dict:
    """3-seed mean (and std) of every figure, the CI of the in-domain test mean."""
    row = {"lever": label, "seeds": len(recs)}
    for key in [k for k in recs[0] if k not in ("test_items", "strength", "seed")]:
        vals = np.array([r[key] for r in recs], dtype=float)
        row[key], row[f"{key}_std"] = float(vals.mean()), float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
    if ci:  # the bootstrap (1,000 resamples; STS: a Spearman each) only for table rows, not curve points
        row["ci"] = list(_ci(scorer.task, [r["test_items"] for r in recs]))
    if "strength auto" in label:
        row["strengths"] = [r["strength"] for r in recs]
    return row


def levers(scorer: Scorer, runs: Path, name: str) -> tuple[list[dict], dict]:
    """The table rows of one dataset, and the default head's mean strength curve (for the picture)."""
    heads = []
    for g in GRIDS:
        if (runs / f"{name}-{g}" / "results.parquet").is_file():
            heads += [{**h, "grid": g} for h in stack_curves(scorer, runs / f"{name}-{g}")]
    groups: dict[tuple, list[dict]] = {}
    for h in heads:
        r = h["row"]
        key = (h["grid"], h["energy"], r.get("anchor_weight") or 0.0, r["lr"], Path(r.get("anchor_data") or "").stem,
               r.get("sides") or "both")
        groups.setdefault(key, []).append(h)
    rows, curve = [], {}
    for (grid, energy, lam, lr, rows_of, sides), hs in groups.items():
        full = [next(p for p in h["curve"] if p["strength"] == 1.0) for h in hs]
        tag = (("query-side " if sides == "query" else "") + f"{energy}"
               + (f", anchor {lam:g} ({rows_of or 'store'} rows)" if lam else "")
               + (f", lr {lr:g}" if grid == "soup" else ""))
        rows.append(aggregate(scorer, f"{tag}", full))
        chosen = choose([h["curve"] for h in hs], scorer.selection.delta if scorer.selection else 0.0)
        picked = [{**next(p for p in h["curve"] if p["strength"] == a)} for h, a in zip(hs, chosen)]
        rows.append(aggregate(scorer, f"{tag} + strength auto", picked))
        if grid == "base":
            curve[energy] = [aggregate(scorer, f"a={a:g}", [h["curve"][i] for h in hs], ci=False)
                             for i, a in enumerate(STRENGTHS)]
    rows += soups(scorer, runs / f"{name}-soup")
    return rows, curve


def soups(scorer: Scorer, grid: Path) -> list[dict]:
    """Soup of 3 per seed (heads.artefacts.soup), for each energy's heads of the soup grid."""
    if not (grid / "results.parquet").is_file():
        return []
    rows = read_results(grid).filter(pl.col("status") == "ok")
    out = []
    for energy in rows["energy"].unique(maintain_order=True).to_list():
        recs = []
        for seed in sorted(set(rows["seed"].to_list())):
            model, norm, config = load_soup_of_energy(grid, energy, seed)
            rec = scorer.score(model, norm, energy)[0]
            recs.append(rec)
        out.append(aggregate(scorer, f"{energy}, soup of 3 lrs", recs))
    return out


def load_soup_of_energy(grid: Path, energy: str, seed: int):
    """The soup of 3 of one seed among one energy's heads: the grid's results filtered to that energy."""
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="soup-"))
    frame = read_results(grid)
    frame.filter(pl.col("energy") == energy).write_parquet(tmp / "results.parquet")
    (tmp / "heads").symlink_to((grid / "heads").resolve())
    try:
        return load_soup(tmp, 3, seed)
    finally:
        shutil.rmtree(tmp)


def markdown(name: str, frozen: dict, rows: list[dict], ood: list[str]) -> str:
    head = ["lever", "dev", "test (3-seed mean ± std)", "95% CI", *ood, "OOD dev loss", "a"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines.append("| " + " | ".join(["frozen cosine", f"{frozen['dev']:.4f}", f"{frozen['test']:.4f}", "",
                                     *[f"{frozen[o]:.4f}" for o in ood], "0", "0"]) + " |")
    for r in rows:
        cells = [r["lever"], f"{r['dev']:.4f}", f"{r['test']:.4f} ± {r['test_std']:.4f}",
                 f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]", *[f"{r[o]:.4f}" for o in ood],
                 f"{r['ood_loss']:+.4f}" if "ood_loss" in r else "",
                 "/".join(f"{a:g}" for a in r.get("strengths", [])) or "1"]
        lines.append("| " + " | ".join(cells) + " |")
    return f"### {name}\n\n" + "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--runs", required=True, type=Path)
    ap.add_argument("--datasets", default=",".join(STUDY))
    ap.add_argument("--out", type=Path, default=Path("docs/img/robust-tradeoff.png"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    root = datasets_root()
    results, text = {}, []
    for name in args.datasets.split(","):
        scorer = Scorer(args.store, name, root)
        frozen = scorer.frozen()
        rows, curve = levers(scorer, args.runs, name)
        ood = list(scorer.ood)
        results[name] = {"frozen": {k: v for k, v in frozen.items() if k != "test_items"}, "rows": rows,
                         "curve": curve, "ood": ood}
        text.append(markdown(name, frozen, rows, ood))
        print(text[-1], flush=True)
    (args.runs / "robust-study.md").write_text("\n".join(text))
    (args.runs / "robust-study.json").write_text(json.dumps(results, indent=1, default=float))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if any(r["ood"] for r in results.values()):
        picture({n: r for n, r in results.items() if r["ood"]}, args.out)


if __name__ == "__main__":
    main()
