"""What `featurize --taps` costs over a plain store: the same texts encoded into fresh stores with and without taps,
alternately (A B A B ...) in one process, so both see the same machine load; encoder seconds, bytes per text.

    python3 bench/studies/taps_featurize_cost.py --data ../shared/datasets/stsb --n 1000 --repeats 2 \\
        --work WORK/cost --json bench/results/taps-featurize-cost-zen4-DATE.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from headstore.data.dataset import load_dataset  # noqa: E402
from headstore.featurize.encoder.config import FeaturizeConfig  # noqa: E402
from headstore.featurize.run.local import featurize_texts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="A dataset whose first --n unique texts are encoded.")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--work", required=True)
    parser.add_argument("--json", required=True)
    a = parser.parse_args()
    texts = list(dict.fromkeys(load_dataset(a.data).texts()))[: a.n]
    runs = []
    for r in range(a.repeats):
        for taps in (False, True):
            store = Path(a.work) / f"store-taps{int(taps)}-r{r}"
            shutil.rmtree(store, ignore_errors=True)
            config = FeaturizeConfig(model="minilm", max_length=a.max_length, precision=a.precision, taps=taps,
                                     backend="torch")
            s = featurize_texts(config, texts, store)
            runs.append({"taps": taps, "repeat": r, "encoder_seconds": s["encoder_seconds"],
                         "real_tokens": s["real_tokens"], "bytes_per_text": s["bytes_per_text"],
                         "load": os.getloadavg()[0]})
            shutil.rmtree(store, ignore_errors=True)
            print(json.dumps(runs[-1]), flush=True)
    plain = sum(r["encoder_seconds"] for r in runs if not r["taps"])
    tapped = sum(r["encoder_seconds"] for r in runs if r["taps"])
    out = {"n_texts": len(texts), "runs": runs, "taps_over_plain_seconds": tapped / plain,
           "bytes_per_text": runs[-1]["bytes_per_text"]}
    print(f"taps / plain encoder seconds: {tapped / plain:.2f} ({tapped:.1f} s / {plain:.1f} s over "
          f"{a.repeats} repeats of {len(texts)} texts); bytes per text {out['bytes_per_text']}")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
