"""Score-level fusion of channels that see different things (issue 57): a taps head's (or an ensemble's) -E beside
the frozen encoder's cosine, frozen + head's -E, or a TF-IDF cosine of the two texts, each standardised over dev's
pairs (`z`: minus dev's mean, over dev's standard deviation; `rank`: dev's empirical CDF), summed with weights
chosen on dev alone from a small grid (the first channel's weight is 1). The fusion's constants (means, spreads,
CDFs, weights) come from STS-B's dev and are used as they are on test and on SemEval without STS-B's sentences.
Test and SemEval are read for the table only. 95% two-level CIs (units and pairs), and the difference from each
--reference unit by unit, as bench/studies/taps_ensembles.py does.

    python3 bench/studies/taps_fusion.py --store S --data ../shared/datasets/stsb \\
        --semeval ../shared/datasets/semeval-sts-2012-2016 --spec spec.json --cache WORK/vals \\
        --json bench/results/taps-fusion-stsb-zen4-DATE.json

spec.json: {"channels": {"name": [["head", ...], ...] | "frozen cosine" | "tfidf cosine", ...},
            "candidates": {"name": {"channels": ["name", ...], "transform": "z" | "rank" | "none",
                                    "weights": [1, ...] (optional: given, not chosen on dev)}, ...},
            "references": ["candidate name", ...]}
A channel of units is as taps_ensembles' spec (a unit's -E is its heads' mean); "frozen cosine" and "tfidf cosine"
take no training and are the same in every unit.
"""
from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from headstore.featurize.store.reader import FeatureStore  # noqa: E402
from headstore.heads.scoring.bootstrap import two_level_ci  # noqa: E402
from taps_ensembles import ci_text, study_parser, train_seconds, unit_values, units_text  # noqa: E402
from taps_study import eval_pairs, frozen_values  # noqa: E402

N_BOOT = 1000
CURVE_KEPT = 40  # the JSON keeps the dev figure of this many best grid points
WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5)  # a secondary channel's weight (the first's is 1)


def tfidf_values(store: FeatureStore, data: str, pairs) -> np.ndarray:
    """(n,) cosine of the two texts' TF-IDF vectors (word unigrams and bigrams, sublinear tf, idf from the
    training split's texts only): the words the pair shares, weighted by how rare they are."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    from headstore.heads.kinds import load_task
    text = store.texts["text"].to_list()
    train = load_task(data, store).train
    rows = sorted(set(np.asarray(train.anchor).tolist()) | set(np.asarray(train.positive).tolist()))
    vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True).fit([text[r] for r in rows])
    a = vec.transform([text[r] for r in pairs.anchor])
    b = vec.transform([text[r] for r in pairs.positive])
    return np.asarray(a.multiply(b).sum(1)).ravel()  # rows are L2-normalised: the dot product is the cosine


def channel_values(a, spec, store, sets: dict) -> dict:
    """split -> (units or 1, n) values of one channel."""
    if spec == "frozen cosine":
        return {s: frozen_values(store, p)[None] for s, p in sets.items()}
    if spec == "tfidf cosine":
        return {s: tfidf_values(store, a.data, p)[None] for s, p in sets.items()}
    if isinstance(spec, str):
        raise ValueError(f"{a.spec}: channel {spec!r}: a list of units, 'frozen cosine' or 'tfidf cosine'")
    return {s: unit_values(a, spec, s, store, p) for s, p in sets.items()}


def standardised(values: dict, transform: str) -> dict:
    """split -> (units, n) values put on dev's scale, unit by unit (dev's constants on every split)."""
    dev = values["dev"]
    if transform == "none":  # the raw -E: equal weights are the mean energy of heads (taps_ensembles' rule)
        return values
    if transform == "z":
        mean, sd = dev.mean(1, keepdims=True), dev.std(1, keepdims=True)
        return {s: (v - mean) / sd for s, v in values.items()}
    if transform == "rank":  # dev's empirical CDF, interpolated between its sorted values
        ref = np.sort(dev, 1)
        grid = (np.arange(ref.shape[1]) + 0.5) / ref.shape[1]
        return {s: np.stack([np.interp(x, r, grid) for x, r in zip(v, ref)]) for s, v in values.items()}
    raise ValueError(f"transform {transform!r}; valid: ['none', 'rank', 'z']")


def spearman_per_unit(v: np.ndarray, gold: np.ndarray) -> list[float]:
    return [float(spearmanr(x, gold).statistic) for x in v]


def fit_weights(parts: list[dict], gold_dev: np.ndarray) -> tuple[tuple, dict]:
    """The weights (1 for the first channel, WEIGHTS for each other) of the best mean dev Spearman over units;
    every grid point's dev figure too."""
    curve = {}
    for ws in itertools.product(*[WEIGHTS] * (len(parts) - 1)):
        w = (1.0, *ws)
        fused = sum(wi * p["dev"] for wi, p in zip(w, parts))
        curve[w] = float(np.mean(spearman_per_unit(np.atleast_2d(fused), gold_dev)))
    best = max(curve, key=lambda w: (curve[w], -sum(w)))  # ties: the smaller weights
    return best, curve


def fused_values(parts: list[dict], w: tuple) -> dict:
    return {s: np.atleast_2d(sum(wi * p[s] for wi, p in zip(w, parts))) for s in parts[0]}


def row(name: str, cand: dict, channels: dict, raw: dict, gold: dict, refs: dict) -> tuple[dict, dict]:
    """One candidate's figures and its fused values (split -> (units, n))."""
    parts = [standardised(raw[c], cand.get("transform", "z")) for c in cand["channels"]]
    if "weights" in cand:  # given, not fitted
        w, curve = tuple(cand["weights"]), {}
    else:
        w, curve = fit_weights(parts, gold["dev"]) if len(parts) > 1 else ((1.0,), {})
    v = fused_values(parts, w)
    units = [u for c in cand["channels"] if not isinstance(channels[c], str) for u in channels[c]]
    out = {"name": name, **cand, "weights": list(w), "dev_by_weights": {str(k): curve[k] for k in sorted(curve, key=curve.get, reverse=True)[:CURVE_KEPT]},
           "train_seconds_per_unit": float(np.sum(
               [np.mean(train_seconds(channels[c])) for c in cand["channels"] if not isinstance(channels[c], str)])),
           "heads": units}
    for split, x in v.items():
        per = spearman_per_unit(x, gold[split])
        out[split], out[f"{split}_per_unit"] = float(np.mean(per)), per
        if curve and split != "dev":  # a bound, never a choice: the best this split could get from the grid
            out[f"{split}_best_on_grid_not_chosen"] = max(
                float(np.mean(spearman_per_unit(fused_values(parts, g)[split], gold[split]))) for g in curve)
        out[f"{split}_ci"] = two_level_ci(x, N_BOOT, 0, gold=gold[split], statistic="spearman")
        for rname, ref in refs.items():
            if rname != name:
                m = np.broadcast_to(ref[split], x.shape) if len(ref[split]) == 1 else ref[split]
                if m.shape == x.shape:
                    out[f"{split}_minus[{rname}]_ci"] = two_level_ci(x, N_BOOT, 0, gold=gold[split],
                                                                     statistic="spearman", minus=m)
    return out, v


def line(r: dict, ref: str) -> str:
    w = "/".join(f"{x:g}" for x in r["weights"])
    return (f"| {r['name']} | {w} | {r['dev']:.4f} ({units_text(r['dev_per_unit'])}) | "
            f"{ci_text(r, f'dev_minus[{ref}]_ci')} | {r['test']:.4f} ({units_text(r['test_per_unit'])}) | "
            f"[{r['test_ci'][0]:.3f}, {r['test_ci'][1]:.3f}] | {ci_text(r, f'test_minus[{ref}]_ci')} | "
            f"{r['semeval']:.4f} | {ci_text(r, f'semeval_minus[{ref}]_ci')} |")


def main() -> None:
    parser = study_parser(__doc__)
    parser.add_argument("--same-width-residual", action="store_true",
                        help="Score heads trained by taps_samewidth.py (residual over arrays of one width).")
    a = parser.parse_args()
    if a.same_width_residual:
        import taps_samewidth
        taps_samewidth.allow()
    spec = json.loads(Path(a.spec).read_text())
    channels, cands, references = spec["channels"], spec["candidates"], spec.get("references", [])
    for name, c in cands.items():
        bad = [x for x in c["channels"] if x not in channels]
        if bad:
            parser.error(f"{a.spec}: candidate {name!r}: channels {bad} not in {sorted(channels)}")
    Path(a.cache).mkdir(parents=True, exist_ok=True)
    store = FeatureStore.open(a.store)
    sets = eval_pairs(store, a.data, a.semeval, splits=("dev", "test"))
    gold = {s: np.asarray(p.labels, np.float64) for s, p in sets.items()}
    used = {c for x in cands.values() for c in x["channels"]}
    raw = {c: channel_values(a, channels[c], store, sets) for c in channels if c in used}
    rows, refs = [], {}
    first = references[0] if references else ""
    print("| candidate | weights | dev (units) | dev - reference | test (units) | test 95% CI | test - reference | "
          "SemEval | SemEval - reference |\n|---|---|---|---|---|---|---|---|---|")
    for name in references + [n for n in cands if n not in references]:
        r, v = row(name, cands[name], channels, raw, gold, refs)
        if name in references:
            refs[name] = v
        rows.append(r)
        print(line(r, first), flush=True)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps({"rows": rows, "references": references, "store": a.store,
                                        "weights_grid": WEIGHTS}, indent=1, default=float))


if __name__ == "__main__":
    main()
