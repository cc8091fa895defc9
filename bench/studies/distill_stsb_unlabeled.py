"""Unlabeled sentences for the STS-B distillation (docs/distill.md): the MRPC news sentences of
../shared/datasets/pairs-small (both columns, every split, labels unused) that are no STS-B sentence and no SemEval
sentence (compared lower-cased, whitespace collapsed: STS-B and SemEval both hold MRPC's MSRpar pairs), written as a
Parquet `text` column and counted. The out-of-domain test set's texts never become anchors this way.

    python3 bench/studies/distill_stsb_unlabeled.py --out WORK/unlabeled/mrpc-sentences.parquet
    cli featurize --store STORE --unlabeled WORK/unlabeled/mrpc-sentences.parquet --model minilm ...
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from headstore.heads.experiments.compare.datasets_root import datasets_root  # noqa: E402


def normalised(text: str) -> str:
    return " ".join(text.split()).lower()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="The Parquet file to write (outside the work tree).")
    args = parser.parse_args()
    root = datasets_root()
    mrpc = pl.read_parquet(root / "pairs-small" / "mrpc_labeled.parquet")
    texts = list(dict.fromkeys([*mrpc["sentence1"], *mrpc["sentence2"]]))
    taken = {}
    for name, path in (("STS-B", root / "stsb" / "stsb.parquet"),
                       ("SemEval", root / "semeval-sts-2012-2016" / "semeval_sts.parquet")):
        frame = pl.read_parquet(path)
        taken[name] = {normalised(t) for t in [*frame["sentence1"], *frame["sentence2"]]}
    kept = [t for t in texts if not any(normalised(t) in s for s in taken.values())]
    print(f"MRPC: {len(texts):,} unique sentences; also in STS-B {sum(normalised(t) in taken['STS-B'] for t in texts):,}"
          f", in SemEval {sum(normalised(t) in taken['SemEval'] for t in texts):,}; kept {len(kept):,}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pl.DataFrame({"text": kept}).write_parquet(args.out)
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
