"""Score-level ensembles of heads on a tap store (issue 57): each candidate is a list of units, a unit one head
or several (the mean of their L1 energies, members free to read different arrays), one unit a "seed". Dev for
every candidate; test, SemEval without STS-B's sentences, 95% two-level CIs (units and pairs) and the difference
from each --reference (the first in the table) unit by unit. Per-pair values are cached under --cache (a rerun reads them).

    python3 bench/studies/taps_ensembles.py --store S --data ../shared/datasets/stsb \\
        --semeval ../shared/datasets/semeval-sts-2012-2016 --spec spec.json --reference "frozen + head" \\
        --cache WORK/vals --json bench/results/taps-ensembles-stsb-zen4-DATE.json

spec.json: {"name": [["head", ...], ...], ...} (the unit's heads: train-head folders or GRID#id=HEAD_ID).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from headstore.featurize.store.reader import FeatureStore  # noqa: E402
from headstore.heads.artefacts.files import read_results  # noqa: E402
from headstore.heads.artefacts.head import Head  # noqa: E402
from headstore.heads.scoring.bootstrap import two_level_ci  # noqa: E402
from taps_study import eval_pairs, pair_values  # noqa: E402

N_BOOT = 1000
SPLITS = ("dev", "test", "semeval")


def cached_values(cache: Path, head_dir: str, split: str, store, pairs) -> np.ndarray:
    """-E of each pair of `split` under the head at `head_dir` (computed once, then read from `cache`)."""
    key = hashlib.sha256(str(Path(head_dir).resolve()).encode()).hexdigest()[:16]
    f = cache / f"{key}.{split}.npy"
    if not f.is_file():
        np.save(f, pair_values(Head.load(head_dir), store, pairs))
    return np.load(f)


def unit_values(a, units: list[list[str]], split: str, store, pairs) -> np.ndarray:
    """(units, n): each unit's mean -E over its heads."""
    return np.stack([np.mean([cached_values(Path(a.cache), h, split, store, pairs) for h in unit], 0)
                     for unit in units])


def train_seconds(units: list[list[str]]) -> list[float]:
    """Each unit's training seconds: the sum of its heads' training loops (their config's train_seconds; a grid
    head's is its stack's loop divided by the stack's heads)."""
    def seconds(h: str) -> float:
        if "#id=" not in h:
            return json.loads((Path(h) / "config.json").read_text())["train_seconds"]
        grid, hid = h.split("#id=")
        results = read_results(grid)
        return float(results.filter(results["head_id"] == hid)["train_seconds"][0])
    return [sum(seconds(h) for h in unit) for unit in units]


def row(a, name: str, units: list[list[str]], store, sets: dict, gold: dict, refs: dict) -> dict:
    """One candidate's figures; refs: reference name -> split -> its (units, n) values."""
    out = {"name": name, "units": units, "train_seconds_per_unit": train_seconds(units)}
    for split, pairs in sets.items():
        v = unit_values(a, units, split, store, pairs)
        per = [float(spearmanr(x, gold[split]).statistic) for x in v]
        out[split], out[f"{split}_per_unit"] = float(np.mean(per)), per
        if split == "dev":
            continue
        out[f"{split}_ci"] = two_level_ci(v, N_BOOT, 0, gold=gold[split], statistic="spearman")
        for i, (rname, ref) in enumerate(refs.items()):
            if name != rname and v.shape == ref[split].shape:
                key = f"{split}_minus_reference_ci" if i == 0 else f"{split}_minus[{rname}]_ci"
                out[key] = two_level_ci(v, N_BOOT, 0, gold=gold[split], statistic="spearman", minus=ref[split])
    return out


def units_text(x) -> str:
    return ", ".join(f"{y:.4f}" for y in x)


def ci_text(r: dict, key: str) -> str:
    c = r.get(key)
    return f"[{c[0]:+.4f}, {c[1]:+.4f}]" if c else ""


def study_parser(doc: str) -> argparse.ArgumentParser:
    """The options every tap-store scoring study takes (all required)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for opt in ("--store", "--data", "--semeval", "--spec", "--cache", "--json"):
        parser.add_argument(opt, required=True)
    return parser


def line(r: dict) -> str:
    def f(x):
        return units_text(x)

    def ci(key):
        return ci_text(r, key)
    return (f"| {r['name']} | {r['dev']:.4f} ({f(r['dev_per_unit'])}) | {r['test']:.4f} ({f(r['test_per_unit'])}) | "
            f"[{r['test_ci'][0]:.3f}, {r['test_ci'][1]:.3f}] | {ci('test_minus_reference_ci')} | {r['semeval']:.4f} | "
            f"{ci('semeval_minus_reference_ci')} | {np.mean(r['train_seconds_per_unit']):.1f} |")


def main() -> None:
    parser = study_parser(__doc__)
    parser.add_argument("--reference", action="append", default=[],
                        help="A candidate the differences are taken from (repeatable; the first in the table).")
    a = parser.parse_args()
    spec = json.loads(Path(a.spec).read_text())
    for r in a.reference:
        if r not in spec:
            parser.error(f"--reference {r!r}: not a candidate of {a.spec}; valid: {list(spec)}")
    Path(a.cache).mkdir(parents=True, exist_ok=True)
    store = FeatureStore.open(a.store)
    sets = eval_pairs(store, a.data, a.semeval, splits=("dev", "test"))
    gold = {s: np.asarray(p.labels, np.float64) for s, p in sets.items()}
    refs = {r: {s: unit_values(a, spec[r], s, store, p) for s, p in sets.items() if s != "dev"} for r in a.reference}
    rows = []
    print("| candidate | dev (units) | test (units) | test 95% CI | test - reference | SemEval | SemEval - reference "
          "| training s a unit |\n|---|---|---|---|---|---|---|---|")
    for name, units in spec.items():
        rows.append(row(a, name, units, store, sets, gold, refs))
        print(line(rows[-1]), flush=True)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps({"rows": rows, "reference": a.reference, "store": a.store}, indent=1,
                                       default=float))


if __name__ == "__main__":
    main()
