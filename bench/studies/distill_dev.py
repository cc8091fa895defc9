"""The distillation's defaults chosen on dev (issue 42 part 2), never on test: one setting of DistillConfig
changed at a time from the defaults, the ensemble -> one head distillation of bench/studies/distill_study.py
(its grids, teachers and students; seed 0 unless --seeds), scored on dev beside the teacher and the best single
head. Prints the table and writes JSON; each run is kept under WORK/runs/dev-<setting> (a rerun skips it).

    python3 bench/studies/distill_dev.py --work WORK --scifact-store S --datasets scifact \\
        --try temperature=0.5 --try temperature=2 --try distill_loss=margin-mse --try student_init=single,lr=3e-4
(a --try may set the student's training settings or shape too, e.g. lr or hidden=1024; --k and --teacher-seeds
pick the teacher as distill_study.py's do.)
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))

from distill_study import DATASETS, parse_settings, run_one  # noqa: E402
from limits import machine, machine_line  # noqa: E402


def parse(setting: str) -> dict:
    """"a=1,b=2" -> typed DistillConfig or student training settings ("" -> the defaults)."""
    return parse_settings(list(filter(None, setting.split(","))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--scifact-store", default=None)
    parser.add_argument("--stsb-store", default=None)
    parser.add_argument("--datasets", default="scifact")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--teacher-seeds", default=None, help="As distill_study.py's: one teacher of these seeds.")
    parser.add_argument("--try", dest="tries", action="append", default=[],
                        help="Settings to try, e.g. temperature=2 or distill_loss=kl,pair_weight=0.5 (repeatable).")
    parser.add_argument("--transfer", action="store_true", help="Score the out-of-domain sets on every try (else on "
                        "the defaults' run only), so distill_study.py can reuse the run (--tag dev-SETTING).")
    parser.add_argument("--defaults-tag", default="defaults", help="WORK/runs/TAG of the defaults' run (another one "
                        "once a default changed: a kept run of other settings is refused).")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    m = machine()
    print(machine_line(m))
    rows = []
    for name in args.datasets.split(","):
        for setting in ["", *args.tries]:
            settings = parse(setting)
            variant = "without" if settings.get("unlabeled_anchors") == 0 else DATASETS[name][2][0]
            args.tag = args.defaults_tag if not setting else "dev-" + setting.replace(",", "-").replace("=", "")
            recs = [run_one(args, name, int(s), variant, settings, transfer=args.transfer or not setting)
                    for s in args.seeds.split(",")]
            row = {"dataset": name, "setting": setting or "defaults", "seeds": [r["seed"] for r in recs],
                   "dev": {c: float(np.mean([r["dev"][c] for r in recs])) for c in recs[0]["dev"]},
                   "train_seconds": [r["train_seconds"] for r in recs]}
            rows.append(row)
            print(f"{name} {row['setting']}: dev {row['dev']}", flush=True)
    from tabulate import tabulate

    print(tabulate([(r["dataset"], r["setting"], *(f"{v:.4f}" for v in r["dev"].values())) for r in rows],
                   headers=["dataset", "setting (else the defaults)", *rows[0]["dev"]], disable_numparse=True))
    date = datetime.date.today().isoformat()
    path = Path(args.json or Path(__file__).resolve().parents[1] / "results" / f"distill-dev-zen4-{date}.json")
    path.write_text(json.dumps({"date": date, "machine": m, "split": "dev", "rows": rows}, indent=1, default=float))
    print(f"written: {path}")


if __name__ == "__main__":
    main()
