"""The labelled benchmarks of issue 59, built offline from what is at hand (bench/studies/labels_bench.py runs them).

Each is a `text,label,split` Parquet table (`labels` format) written under `--out`; dev is what headstore carves
out of train (10% of each class), test is scored once:
- `20ng-topic6`: a stratified sample of 20 Newsgroups (`body`; TRAIN_PER_CLASS train and TEST_PER_CLASS test
  posts of each group, seed 0), labels `topic6:newsgroup` (six top-level groups over the 20 newsgroups: a
  two-level COARSE:fine hierarchy);
- `20ng-skewed`: the same posts, flat newsgroup labels, the train split cut to a geometric spread of class
  sizes (TRAIN_PER_CLASS down to SKEW_SMALLEST texts, classes in a seeded order): few texts in some classes and
  many in others; test balanced;
- `trec-qc`: the TREC question classification set (Li & Roth 2002: 5,452 train / 500 test questions, labels
  `COARSE:fine`, 6 coarse / 50 fine classes) when `--trec DIR` holds its `train_5500.label` and
  `TREC_10.label` files (one `LABEL question` per line); it is not in shared/datasets, so it is skipped
  (said) without it.

Why a sample of 20 Newsgroups: when these tables were built, all 18,771 non-empty bodies at 256 tokens (3.87M
tokens) showed an ETA of 5+ hours of MiniLM on the 2-core CPU at load 22-27, so the sample at 128 tokens was what
the benchmark could afford (`--max-length 128`). At load 6-8 (OpenVINO, 1,846 tokens/s) the whole set took 35 min
(2026-11-29); labels_bench.py runs it too, as `20ng-full`, from its own store.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

TRAIN_PER_CLASS = 120  # 20 Newsgroups train posts per group in the sample
TEST_PER_CLASS = 50  # test posts per group (1,000 test texts: a 95% interval of about +-2.5 points)
SKEW_SMALLEST = 4  # the skewed table's smallest class (its largest: TRAIN_PER_CLASS)
SEED = 0


def newsgroups_sample(path: Path) -> pl.DataFrame:
    """TRAIN_PER_CLASS / TEST_PER_CLASS posts of each group with a non-empty body, drawn with SEED."""
    frame = pl.read_parquet(path).filter(pl.col("body").str.strip_chars().str.len_chars() > 0)
    parts = []
    for (split, label), group in sorted(frame.group_by(["split", "label"]), key=lambda kv: kv[0]):
        n = TRAIN_PER_CLASS if split == "train" else TEST_PER_CLASS
        parts.append(group.sample(n=min(n, group.height), seed=SEED, shuffle=True))
    return pl.concat(parts).select("body", "label", "topic6", "split").rename({"body": "text"})


def skewed_sizes(labels: list[str]) -> dict[str, int]:
    """A geometric spread of train sizes from TRAIN_PER_CLASS down to SKEW_SMALLEST, over the classes in a
    seeded order."""
    order = np.random.default_rng(SEED).permutation(sorted(labels))
    ratio = (SKEW_SMALLEST / TRAIN_PER_CLASS) ** (1 / max(1, len(order) - 1))
    return {str(c): max(SKEW_SMALLEST, int(round(TRAIN_PER_CLASS * ratio ** i))) for i, c in enumerate(order)}


def newsgroups_tables(path: Path) -> dict[str, pl.DataFrame]:
    sample = newsgroups_sample(path)
    topic6 = sample.select("text", pl.concat_str("topic6", pl.lit(":"), "label").alias("label"), "split")
    sizes = skewed_sizes(sample["label"].unique().to_list())
    train = sample.filter(pl.col("split") == "train")
    cut = pl.concat([g.head(sizes[label]) for (label,), g in sorted(train.group_by(["label"]), key=lambda kv: kv[0])])
    skewed = pl.concat([cut, sample.filter(pl.col("split") == "test")]).select("text", "label", "split")
    return {"20ng-skewed": skewed, "20ng-topic6": topic6}  # the smaller first


def trec_table(folder: Path) -> pl.DataFrame:
    """TREC question classification: `COARSE:fine question` lines; a line without a label is an error."""
    rows = []
    for name, split in (("train_5500.label", "train"), ("TREC_10.label", "test")):
        for i, line in enumerate((folder / name).read_text(encoding="latin-1").splitlines()):
            if not line.strip():
                continue
            label, _, text = line.partition(" ")
            if ":" not in label or not text.strip():
                raise ValueError(f"{folder / name}: line {i + 1} is not 'COARSE:fine question': {line[:60]!r}")
            rows.append((text.strip(), label, split))
    return pl.DataFrame(rows, schema=["text", "label", "split"], orient="row")


def build(out: Path, newsgroups: Path, trec: Path | None) -> dict[str, Path]:
    """Every benchmark table under `out` (written anew each time: they are cheap), {name: path}."""
    out.mkdir(parents=True, exist_ok=True)
    tables = newsgroups_tables(newsgroups)
    if trec is not None and (trec / "train_5500.label").exists():
        tables["trec-qc"] = trec_table(trec)
    else:
        print(f"trec-qc skipped: no train_5500.label under {trec} (give --trec DIR)")
    paths = {}
    for name, frame in tables.items():
        paths[name] = out / f"{name}.parquet"
        frame.write_parquet(paths[name])
    return paths
