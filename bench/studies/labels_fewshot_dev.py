"""Choosing the few-shot heads' schedule on dev, never on test.

Few-shot heads have no dev split to stop on, so their epochs and learning rate are fixed before the
test run. This script picks them on the dev slice of 20 Newsgroups' train split (held out of the
texts the shots are drawn from): every loss x epochs x lr, 16 texts per class, seeds 0-2, scored on
dev beside the frozen probe and k-NN on the same shots. It prints the summary table and writes JSON.

    python bench/studies/labels_fewshot_dev.py --store runs/store-20ng --json runs/labels-fewshot-dev.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from headstore.heads.experiments.grid import run_grid  # noqa: E402
from headstore.heads.experiments.summary import summarize, summary_table  # noqa: E402
from headstore.heads.kinds.labels import SUMMARY_METRICS  # noqa: E402
from headstore.heads.experiments.datasets_root import datasets_root  # noqa: E402

GRID = """[grid]
loss = {losses}
epochs = [3, 10, 20]
lr = [1e-4, 1e-3]
shots = [{shots}]
seed = [0, 1, 2]
[fixed]
batch_size = 64
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--data", default=str(datasets_root() / "20newsgroups"))
    parser.add_argument("--format", default="labels?text_column=body")
    parser.add_argument("--shots", type=int, default=16)
    parser.add_argument("--losses", default="supcon-kl,supcon,l1-energy")
    parser.add_argument("--out", default=None, help="Results folder (default: a temporary one).")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="labels-dev-"))
    grid = out / "dev-grid.toml"
    out.mkdir(parents=True, exist_ok=True)
    grid.write_text(GRID.format(losses=json.dumps(args.losses.split(",")), shots=args.shots))
    frame = run_grid(args.store, args.data, str(grid), str(out), args.format, progress=False, score_split="dev")
    summary = summarize(frame, SUMMARY_METRICS)
    print(summary_table(summary))
    Path(args.json).write_text(json.dumps({"split": "dev", "shots": args.shots, "summary": summary.to_dicts()},
                                          indent=1, default=float))


if __name__ == "__main__":
    main()
