"""A labelled table (four classes of ten train and five test texts: 10 a class gives 5 even cross-validation
folds), variants with one train text a class and with a class of two, and an STS table, all featurized by a
tiny random BERT; `train` runs train-head on one of them."""
from __future__ import annotations

import json
import random

import polars as pl
from click.testing import CliRunner

from headstore.cli import main

from .finetune_world import WORDS, tiny_bert


def recipe_world(root):
    rng = random.Random(0)
    groups = [WORDS[i::4] for i in range(4)]
    rows = [{"text": " ".join([rng.choice(groups[c]) for _ in range(2)] + [rng.choice(WORDS) for _ in range(4)])
             + f" {c}{i}", "label": f"top{c // 2}.sub{c}",
             "split": "train" if i < 10 else "test"} for c in range(4) for i in range(15)]
    pl.DataFrame(rows).write_parquet(root / "news.parquet")
    one = [r for r in rows if r["split"] == "test" or r["text"].endswith(("00", "10", "20", "30"))]
    pl.DataFrame(one).write_parquet(root / "one.parquet")  # one train text per class
    few = [r for r in rows if r["label"] != "top1.sub3" or r["split"] == "test" or r["text"].endswith(("30", "31"))]
    pl.DataFrame(few).write_parquet(root / "few.parquet")  # top1.sub3 has 2 train texts
    pl.DataFrame({"sentence1": [r["text"] for r in rows[:20]], "sentence2": [r["text"] for r in rows[20:40]],
                  "score": [float(i % 6) for i in range(20)]}).write_parquet(root / "sts.parquet")
    model = tiny_bert(root / "model", layers=2)
    store = root / "store"
    r = CliRunner().invoke(main, ["featurize", "--model", str(model), "--data", str(root / "news.parquet"), "--data",
                                  str(root / "sts.parquet"), "--store", str(store), "--dtype", "float32"])
    assert r.exit_code == 0, r.output
    return root, store


def train_head(world, data, out, *args):
    root, store = world
    r = CliRunner().invoke(main, ["train-head", "--store", str(store), "--data", str(root / data), "--out",
                                  str(root / out), "--batch-size", "8", "--hidden", "16", *args])
    return r, (json.loads((root / out / "metrics.json").read_text()) if r.exit_code == 0 else None)
