"""Why the compare table's tuned encoders keep their start (issue 37): two controls and the dev rule overridden.

In the SciFact table every tuned family, at every learning rate, scored below its start (frozen + head) on dev
after each epoch, so the dev rule kept the start. Three questions, each a `cli finetune` run from the table's
own frozen + head of a seed, with the table's settings except the one named (the commands are in
docs/setups.md):
- head only: the encoder frozen in effect (encoder lr 1e-9): is the fall the head's further training?
- encoder only: the head frozen in effect (head lr 1e-9), the encoder at the chosen 1e-5: is it the encoder?
- forced: full fine-tuning at 1e-5 with the dev rule overridden (patience 1, keep the last epoch: epoch 1), then
  its own store and test: does dev hide a test gain? Paired seed by seed with the table's frozen + head on the
  same test items (two-level 95% CI, heads.scoring.bootstrap), in and out of domain.

    python3 bench/studies/compare_controls.py --compare COMPARE --controls CONTROLS --seeds 0,1,2 --json OUT.json

CONTROLS holds headonly-s0/, encoderonly-s0/ (finetune outputs), forced1-s{seed}/ and their stores
forced1-s{seed}-store/; scored items are cached in CONTROLS/forced1-s{seed}-items-{dataset}.json.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))

from headstore.heads.experiments.compare.report import _eval  # noqa: E402
from headstore.heads.experiments.compare.datasets_root import datasets_root  # noqa: E402
from headstore.heads.scoring.bootstrap import two_level_ci  # noqa: E402
from distill_study import share_ci, share_words  # noqa: E402
from limits import machine, machine_line  # noqa: E402

DATASETS = ("scifact", "cranfield", "cacm")  # in domain first; the others drop queries that use a SciFact text
N_BOOT = 1000


def dev_curve(folder: Path) -> dict:
    if not (folder / "finetune.json").is_file():
        raise SystemExit(f"{folder}: no finetune.json (run the `cli finetune` of the module doc first)")
    run = json.loads((folder / "finetune.json").read_text())
    return {"encoder_lr": run["config"]["encoder_lr"], "head_lr": run["config"]["head_lr"],
            "dev": [c["dev"] for c in run["dev_curve"]], "loss": [c.get("loss") for c in run["dev_curve"]],
            "kept_epoch": run["kept_epoch"], "seconds": run["seconds"]}


def table_items(compare: Path, seed: int, dataset: str) -> dict:
    """The table's frozen + head of `seed` on `dataset`: its eval step's record (items included)."""
    found = glob.glob(str(compare / f"eval-base-s{seed}-{dataset}-*" / "step.json"))
    if len(found) != 1:
        raise SystemExit(f"{compare}: {len(found)} eval steps of frozen + head, seed {seed}, on {dataset} (need one: "
                         "run the table to its end)")
    (step,) = found
    return json.loads(Path(step).read_text())["result"]


def forced_items(controls: Path, seed: int, dataset: str) -> dict:
    """The forced run of `seed` scored on `dataset` as the table scores its rows (compare_report._eval)."""
    cache = controls / f"forced1-s{seed}-items-{dataset}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    root = datasets_root()
    exclude = None if dataset == DATASETS[0] else str(root / DATASETS[0])
    folder = controls / f"forced1-s{seed}-eval-{dataset}-items"
    record = _eval(controls / f"forced1-s{seed}-store", controls / f"forced1-s{seed}" / "head", str(root / dataset),
                   folder, exclude)
    record = json.loads(json.dumps(record, default=lambda a: np.asarray(a).tolist()))
    cache.write_text(json.dumps(record))
    return record


def share_of_gain(head: np.ndarray, tuned: np.ndarray, cosine: np.ndarray) -> tuple[float, dict]:
    """mean(head - cosine) / mean(tuned - cosine) over seeds: the share of the tuned encoder's in-domain gain over
    the frozen encoder that frozen + head recovers, with its 95% interval from the two-level resamples
    (distill_study.share_ci: the same ratio of paired gains, the cosine in the reference's place; no interval, and
    "gain not resolved", where over 5% of the resamples have no tuned gain)."""
    point = float(np.mean(head - cosine) / np.mean(tuned - cosine))
    return point, share_ci({"single": cosine, "teacher": tuned, "distilled": head, "gold": None}, "mean")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", required=True, help="The compare table's --out folder.")
    parser.add_argument("--controls", required=True)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    compare, controls, seeds = Path(args.compare), Path(args.controls), [int(s) for s in args.seeds.split(",")]
    m = machine()
    print(machine_line(m))
    curves = {name: dev_curve(controls / name) for name in ("headonly-s0", "encoderonly-s0")}
    curves |= {f"forced1-s{s}": dev_curve(controls / f"forced1-s{s}") for s in seeds}
    for name, c in curves.items():
        head_lr = c["head_lr"] or "the head's"
        print(f"{name:16s} encoder lr {c['encoder_lr']:g} head lr {head_lr}: dev per epoch "
              + ", ".join(f"{d:.4f}" for d in c["dev"]))
    rows = {}
    for ds in DATASETS:
        base = [table_items(compare, s, ds) for s in seeds]
        forced = [forced_items(controls, s, ds) for s in seeds]
        head_base = np.stack([np.asarray(r["items"]["head"], dtype=np.float64) for r in base])  # (S, n)
        head_forced = np.stack([np.asarray(r["items"]["head"], dtype=np.float64) for r in forced])  # (S, n)
        cos_forced = np.stack([np.asarray(r["items"]["baseline"], dtype=np.float64) for r in forced])
        cos_frozen = np.asarray(base[0]["items"]["baseline"], dtype=np.float64)
        rows[ds] = {"frozen_head": [r["value"] for r in base], "forced_head": [r["value"] for r in forced],
                    "frozen_cosine": base[0]["baseline"], "forced_cosine": [r["baseline"] for r in forced],
                    "forced_minus_frozen_head_ci": two_level_ci(head_forced, N_BOOT, minus=head_base),
                    "forced_cosine_minus_frozen_cosine_ci": two_level_ci(
                        cos_forced, N_BOOT, minus=np.broadcast_to(cos_frozen, cos_forced.shape)),
                    "n_scored": forced[0]["n_scored"]}
        r = rows[ds]
        if ds == DATASETS[0]:
            r["share_of_tuned_gain"], r["share_of_tuned_gain_ci"] = share_of_gain(
                head_base, head_forced, np.broadcast_to(cos_frozen, head_base.shape))
            print(f"frozen + head recovers {share_words(r['share_of_tuned_gain'], r['share_of_tuned_gain_ci'])} of "
                  "the forced fine-tuning's in-domain gain over the frozen encoder")
        lo, hi = r["forced_minus_frozen_head_ci"]
        print(f"{ds:10s} frozen + head {np.mean(r['frozen_head']):.4f}  fine-tuned (epoch 1 forced) + head "
              f"{np.mean(r['forced_head']):.4f}  diff {np.mean(r['forced_head']) - np.mean(r['frozen_head']):+.4f} "
              f"[{lo:+.4f}, {hi:+.4f}]   cosine {r['frozen_cosine']:.4f} -> {np.mean(r['forced_cosine']):.4f}")
    date = datetime.date.today().isoformat()
    path = Path(args.json or Path(__file__).resolve().parents[1] / "results" / f"compare-controls-{date}.json")
    path.write_text(json.dumps({"date": date, "machine": m, "seeds": seeds, "dev_curves": curves, "test": rows},
                               indent=1, default=float))
    print(f"written: {path}")


if __name__ == "__main__":
    main()
