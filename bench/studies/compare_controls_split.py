"""The forced control split into seen and unseen claims (issue 53, "the bet on the split"): does tuning the
encoder help the test claims whose relevant abstracts training never judged?

The compare table cannot say: every tuned family kept its start on dev, so its tuned rows equal frozen + head on
every claim. The forced control of compare_controls.py (full fine-tuning at encoder lr 1e-5 from the table's
frozen + head, epoch 1 kept whatever dev says, then its own store) is the tuned encoder that can. Each seed's
frozen + head (the table's head recipe, examples/compare.toml [head]) and its forced run are scored on the same
test queries (heads.experiments.compare.report._eval); SciFact's queries are split by the seen mask
(heads.kinds.seen: a claim is seen when one of its relevant abstracts is judged in training, or in dev, which
selection saw), Cranfield and CACM are all unseen. Each part gives frozen cosine, frozen + head, tuned cosine and
tuned + head, and paired differences with two-level 95% CIs over seeds and queries (heads.kinds.seen.seen_parts;
one seed: the queries-only bootstrap). The commands that make CONTROLS are in docs/setups.md.

    python3 bench/studies/compare_controls_split.py --controls CONTROLS --store BASE_STORE --seeds 0,1,2 --json OUT

CONTROLS holds head-base-s{seed}/ (a train-head output on BASE_STORE), forced1-s{seed}/ (`cli finetune` from it)
and forced1-s{seed}-store/; scored items are cached as {head-base,forced1}-s{seed}-items-{dataset}.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))

from headstore.heads.experiments.compare.report import _eval  # noqa: E402
from headstore.heads.experiments.compare.datasets_root import datasets_root  # noqa: E402
from headstore.heads.kinds.seen import seen_parts  # noqa: E402
from compare_controls import DATASETS, N_BOOT, dev_curve, forced_items  # noqa: E402
from limits import machine, machine_line  # noqa: E402

SYSTEMS = ("frozen_cosine", "frozen_head", "tuned_cosine", "tuned_head")  # the table's columns
# the paired differences: (name, system, reference); the first answers the question
DIFFS = (("tuned_head_minus_frozen_head", "tuned_head", "frozen_head"),
         ("tuned_cosine_minus_frozen_cosine", "tuned_cosine", "frozen_cosine"),
         ("frozen_head_minus_frozen_cosine", "frozen_head", "frozen_cosine"),
         ("tuned_head_minus_frozen_cosine", "tuned_head", "frozen_cosine"))


def base_items(controls: Path, store: Path, seed: int, dataset: str) -> dict:
    """Frozen + head of `seed` (CONTROLS/head-base-s{seed} on the base store) scored on `dataset` as
    compare_controls.forced_items scores the forced run."""
    cache = controls / f"head-base-s{seed}-items-{dataset}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    head = controls / f"head-base-s{seed}"
    if not (head / "config.json").is_file():
        raise SystemExit(f"{head}: no head (train it first: docs/setups.md, the split of the forced control)")
    root = datasets_root()
    exclude = None if dataset == DATASETS[0] else str(root / DATASETS[0])
    record = _eval(store, head, str(root / dataset), controls / f"head-base-s{seed}-eval-{dataset}-items", exclude)
    record = json.loads(json.dumps(record, default=lambda a: np.asarray(a).tolist()))
    cache.write_text(json.dumps(record))
    return record


def seen_of(records: list[dict], dataset: str) -> np.ndarray:
    """The queries' seen mask, the same in every record (all False where a record has none: all unseen)."""
    masks = [np.zeros(len(r["items"]["head"]), bool) if r.get("seen") is None else np.asarray(r["seen"], bool)
             for r in records]
    if any(m.shape != masks[0].shape or (m != masks[0]).any() for m in masks):
        raise SystemExit(f"{dataset}: the runs' seen masks differ (not the same queries or judgements)")
    return masks[0]


def dataset_rows(controls: Path, store: Path, seeds: list[int], dataset: str) -> dict:
    base = [base_items(controls, store, s, dataset) for s in seeds]
    forced = [forced_items(controls, s, dataset) for s in seeds]
    mask = seen_of(base + forced, dataset)
    values = {"frozen_cosine": [r["items"]["baseline"] for r in base], "frozen_head": [r["items"]["head"] for r in base],
              "tuned_cosine": [r["items"]["baseline"] for r in forced], "tuned_head": [r["items"]["head"] for r in forced]}
    values = {k: np.asarray(v, dtype=np.float64) for k, v in values.items()}  # (S, n) each
    parts = {}
    for name, part in (("seen", mask), ("unseen", ~mask), ("all", np.ones_like(mask))):
        if not part.any() or (name == "unseen" and not mask.any()):  # out of domain: "all" alone, all unseen
            continue
        parts[name] = {"n": int(part.sum()),
                       **{k: {"per_seed": v[:, part].mean(1).tolist(), "mean": float(v[:, part].mean())}
                          for k, v in values.items()}}
    for name, system, ref in DIFFS:
        split = seen_parts(values[ref], values[system], mask, N_BOOT)
        for part in parts:
            parts[part][name] = {"delta": split[part]["delta"], "ci": split[part]["ci"]["delta"]}
    return {"metric": base[0]["metric"], "n_scored": base[0]["n_scored"], "dropped": base[0].get("dropped"),
            "all_unseen": not mask.any(), "parts": parts}


def print_table(rows: dict) -> None:
    cols = "frozen cos  frozen+head  tuned cos  tuned+head  tuned+head - frozen+head [95% CI]"
    print(f"{'dataset part':26s} {'n':>4s}  {cols}")
    for ds, r in rows.items():
        for part, p in r["parts"].items():
            d = p[DIFFS[0][0]]
            lo, hi = d["ci"] if d["ci"] else (float("nan"), float("nan"))
            part = f"{part} (all unseen)" if r["all_unseen"] else part
            print(f"{ds + ' ' + part:26s} {p['n']:4d}  " + "  ".join(f"{p[s]['mean']:.4f}" for s in SYSTEMS)
                  + f"   {d['delta']:+.4f} [{lo:+.4f}, {hi:+.4f}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--controls", required=True)
    parser.add_argument("--store", required=True, help="The base store the frozen + heads were trained on.")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    controls, store, seeds = Path(args.controls), Path(args.store), [int(s) for s in args.seeds.split(",")]
    m = machine()
    print(machine_line(m))
    curves = {f"forced1-s{s}": dev_curve(controls / f"forced1-s{s}") for s in seeds}
    for name, c in curves.items():
        print(f"{name}: dev per epoch " + ", ".join(f"{d:.4f}" for d in c["dev"]) + f" ({c['seconds']:.0f} s)")
    rows = {ds: dataset_rows(controls, store, seeds, ds) for ds in DATASETS}
    print_table(rows)
    date = datetime.date.today().isoformat()
    path = Path(args.json or Path(__file__).resolve().parents[1] / "results" / f"compare-controls-split-{date}.json")
    path.write_text(json.dumps({"date": date, "machine": m, "seeds": seeds, "systems": SYSTEMS,
                                "diffs": [d[0] for d in DIFFS], "dev_curves": curves, "test": rows},
                               indent=1, default=float))
    print(f"written: {path}")


if __name__ == "__main__":
    main()
