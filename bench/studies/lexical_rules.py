"""How dev should choose the lexical channel's numbers on SciFact: BM25 with and without stemming, and dev's best
against the one-standard-error rule (heads.training.lexical_fit.one_se), each scored once on test.

For each seed's head (a folder `cli train-head` wrote on SciFact, e.g. bench/studies/lexical_study.py's), the memory
is fitted again on train alone (heads.training.memory_use.fit_for_head, as train-head fits it) and scored on dev;
on test the head's saved memory. For each BM25 variant, dev picks BM25's weight and the memory's gain from
lexical_fit's WEIGHTS x GAINS by each rule; the table gives dev and test (seen / unseen / all) of the pick.
The test surface (every weight and gain on test) is written to the JSON too: it is not a selection, only a picture
of what dev could have chosen.

    python3 bench/studies/lexical_rules.py --store STORE --heads DIR --json OUT.json [--seeds 0,1,2]

A check on claims no rule was chosen on: `--folds DIR` reads DIR/fold-K (BEIR folders of SciFact's training claims
split K ways: test one fold, dev half of the next, train the rest; the corpus and queries SciFact's own) and the
heads HEADS/fold-K that `cli train-head` trained on them, one seed each.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))

from headstore.featurize.store.reader import FeatureStore  # noqa: E402
from headstore.heads.artefacts.task_features import TaskFeatures  # noqa: E402
from headstore.heads.experiments.compare.datasets_root import datasets_root  # noqa: E402
from headstore.heads.kinds import load_task  # noqa: E402
from headstore.heads.kinds.fused_rank import fused_metrics, lexical_scores  # noqa: E402
from headstore.heads.scoring.bootstrap import two_level_ci  # noqa: E402
from headstore.heads.scoring.lexical import Bm25Config, gained, per_query_scaled  # noqa: E402
from headstore.heads.settings.config import TrainConfig  # noqa: E402
from headstore.heads.training.eval_run import eval_seen  # noqa: E402
from headstore.heads.training.lexical_fit import GAINS, WEIGHTS, one_se, split_dense  # noqa: E402
from headstore.heads.training.memory_use import fit_for_head, load_for_eval  # noqa: E402
from headstore.heads.training.run import load_head  # noqa: E402
from limits import machine, machine_line  # noqa: E402

VARIANTS = {"words": Bm25Config(stemmer=""), "stemmed": Bm25Config()}


def dense_matrices(store, data: str, head_dir: str) -> tuple[dict, object, np.ndarray]:
    """({split: (plain, edited)} dense scores on dev (the memory fitted on train alone) and test (the saved
    memory), the remapped task, test's seen mask (a relevant abstract among the head's judged ones))."""
    model, norm, config = load_head(head_dir)
    tc = TrainConfig.from_dict(config["train"])
    raw = load_task(data, store)
    tf = TaskFeatures.for_task(store, raw)
    task, features = tf.remap(raw), tf.read("features")
    inputs = norm(features) if norm is not None else features.clone()
    held_out = fit_for_head(store, raw, task, inputs, model, tc.eval_energy, tc.negatives, tc.precision)[3]
    saved, _ = load_for_eval(head_dir, store, raw, tf, "auto")
    out = {split: tuple(split_dense(task.eval_sets[split], features, model, norm, m, tc.eval_energy)
                        for m in (None, memory)) for split, memory in (("dev", held_out), ("test", saved))}
    seen, _, _ = eval_seen(head_dir, config, store, load_task(data, store, for_eval=True), "test")
    return out, task, np.asarray(seen["test"], dtype=bool)


def candidates(task, dense: dict, lexical: dict) -> dict:
    """{(gain, weight): {split: per-query nDCG@10}} over lexical_fit's grid."""
    out = {}
    for gain in GAINS:
        for split in ("dev", "test"):
            d = gained(*dense[split], gain)
            scaled, scaled_lexical = per_query_scaled(d), per_query_scaled(lexical[split])
            for w in WEIGHTS:
                score = d if w == 0 else scaled + w * scaled_lexical
                out.setdefault((gain, w), {})[split] = fused_metrics(
                    task.eval_sets[split], lambda s, e, score=score: score[s:e], "cosine")[1]
    return out


def picks(cands: dict) -> dict:
    """{rule: (gain, weight)}: dev's best (the first of equals) and the one-SE rule's pick."""
    keys = list(cands)
    best = max(keys, key=lambda k: cands[k]["dev"].mean())
    near = one_se([cands[k]["dev"] for k in keys])
    simple = min((k for k, ok in zip(keys, near) if ok), key=lambda k: (k[1], GAINS.index(k[0])))
    return {"dev's best": best, "one SE": simple}


def differences(per_query: dict, by_seed: bool) -> dict:
    """{"bm25, rule": (mean, lo, hi)}: the shipped pick (stemmed, one SE) minus each other's on test, paired over
    claims (two-level over seeds and claims; folds: their claims pooled, one level)."""
    def stacked(key):
        parts = per_query[key]
        return np.stack(parts) if by_seed else np.concatenate(parts)[None]  # (S, Q) or (1, all claims)

    shipped = stacked(("stemmed", "one SE"))
    return {f"{b}, {r}": (float((shipped - stacked((b, r))).mean()), *two_level_ci(shipped, minus=stacked((b, r))))
            for b, r in per_query if (b, r) != ("stemmed", "one SE")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--heads", required=True, help="a folder of seed-S head folders trained on SciFact")
    ap.add_argument("--json", required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--folds", default=None, help="a folder of fold-K BEIR folders (HEADS/fold-K their heads)")
    args = ap.parse_args()
    store = FeatureStore.open(args.store)
    if args.folds:
        units = [(int(d.name.split("-")[1]), str(d), str(Path(args.heads) / d.name))
                 for d in sorted(Path(args.folds).glob("fold-*")) if d.is_dir()]
    else:
        units = [(int(s), str(datasets_root() / "scifact"), str(Path(args.heads) / f"seed-{s}"))
                 for s in args.seeds.split(",")]
    rows, surface, per_query = [], {}, {}
    for seed, data, head_dir in units:  # seed: the head's seed, or the fold's number
        dense, task, seen = dense_matrices(store, data, head_dir)
        for name, cfg in VARIANTS.items():
            lexical = {s: lexical_scores(task.eval_sets[s], cfg, task.name) for s in ("dev", "test")}
            cands = candidates(task, dense, lexical)
            surface[f"{name} unit {seed}"] = {f"{g} {w}": [float(v["dev"].mean()), float(v["test"].mean())]
                                              for (g, w), v in cands.items()}
            for rule, (g, w) in picks(cands).items():
                t = cands[(g, w)]["test"]
                per_query.setdefault((name, rule), []).append(np.asarray(t, dtype=np.float64))
                rows.append({"bm25": name, "rule": rule, "unit": seed, "gain": g, "weight": w,
                             "dev": float(cands[(g, w)]["dev"].mean()), "seen": float(t[seen].mean()),
                             "unseen": float(t[~seen].mean()), "all": float(t.mean())})
    print(machine_line(machine()))
    print(f"{'bm25':8s} {'rule':11s} {'picks (gain, weight) per unit':32s} {'dev':>7s} {'seen':>7s} {'unseen':>7s} "
          f"{'all':>7s}")
    for name in VARIANTS:
        for rule in ("dev's best", "one SE"):
            r = [x for x in rows if x["bm25"] == name and x["rule"] == rule]
            mean = {k: np.mean([x[k] for x in r]) for k in ("dev", "seen", "unseen", "all")}
            pick = ", ".join(f"({x['gain']:g}, {x['weight']:g})" for x in r)
            print(f"{name:8s} {rule:11s} {pick:32s} {mean['dev']:7.4f} {mean['seen']:7.4f} {mean['unseen']:7.4f} "
                  f"{mean['all']:7.4f}")
    minus = differences(per_query, by_seed=not args.folds)
    for key, (mean, lo, hi) in minus.items():
        print(f"stemmed, one SE minus {key}: {mean:+.4f} [{lo:+.4f}, {hi:+.4f}]")
    Path(args.json).write_text(json.dumps({"minus_shipped": {k: list(v) for k, v in minus.items()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
        "store": args.store, "heads": args.heads, "folds": args.folds, "rows": rows, "test_surface_not_a_selection": surface}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
