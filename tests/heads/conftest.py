"""A tiny world for the bad-input and pairs tests: a random BERT, one dataset of each kind, one store."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from headstore.cli import main

from .api_world import World
from .finetune_world import sentence, tiny_bert, tiny_beir


def cli(*args) -> "CliRunner.invoke":
    """Run `cli ARGS` in-process; returns click's Result."""
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_bad_input(result, *needles) -> str:
    """The input was refused as bad input: exit 2, one `Error: ...` line naming `needles`, no traceback."""
    out = result.output
    assert result.exit_code == 2, out
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("Error: "), out
    for needle in needles:
        assert str(needle) in last, (needle, last)
    return last


def _pairs(rng, n: int, tag: str) -> tuple[list[str], list[str]]:
    """Positive pairs where anchors share positives now and then (several relevant docs, repeated texts)."""
    anchors, positives = [], []
    for i in range(n):
        anchors.append(f"{sentence(rng, 3)} {tag} {i // 2}")  # every anchor text twice: two positives each
        positives.append(f"{sentence(rng, 5)} {tag} {i % 17}")  # positives repeat across anchors
    return anchors, positives


@pytest.fixture(scope="session")
def data_world(tmp_path_factory):
    """Datasets of every kind and a float32 store holding all their texts (`world["store"]`)."""
    root = tmp_path_factory.mktemp("world")
    rng = random.Random(7)
    w = {"root": root, "model": tiny_bert(root / "model", layers=2)}
    w["beir"] = tiny_beir(root / "beir", seed=3, n_docs=50, n_train=30, n_test=12)
    n = 60
    sts = {"sentence1": [sentence(rng) + f" s{i}" for i in range(n)],
           "sentence2": [sentence(rng) + f" t{i}" for i in range(n)]}
    scores = [rng.uniform(0, 5) for _ in range(n)]
    splits = ["train"] * 36 + ["dev"] * 12 + ["test"] * 12
    w["sts05"] = root / "sts05.parquet"
    pl.DataFrame({**sts, "score": scores, "split": splits}).write_parquet(w["sts05"])
    w["sts10"] = root / "sts10.parquet"  # a 0-10 scale: must be declared
    pl.DataFrame({**sts, "score": [2 * s for s in scores], "split": splits}).write_parquet(w["sts10"])
    w["sts01"] = root / "sts01.csv"  # a 0-1 scale and split names in other spellings
    names = {"train": "Train", "dev": "validation", "test": "TEST"}
    pl.DataFrame({**sts, "score": [s / 5 for s in scores], "split": [names[s] for s in splits]}).write_csv(w["sts01"])
    anchors, positives = _pairs(rng, 90, "p")
    w["pos"] = root / "pos.parquet"  # positives only: anchor, positive, split
    pl.DataFrame({"anchor": anchors, "positive": positives,
                  "split": ["train"] * 50 + ["dev"] * 20 + ["test"] * 20}).write_parquet(w["pos"])
    w["nosplit"] = root / "nosplit.parquet"  # positives only, no split column
    pl.DataFrame({"anchor": anchors, "positive": positives}).write_parquet(w["nosplit"])
    w["labelled"] = root / "labelled.parquet"
    pl.DataFrame({"sentence1": sts["sentence1"], "sentence2": sts["sentence2"],
                  "label": [int(s > 2.5) for s in scores], "split": splits}).write_parquet(w["labelled"])
    w["store"] = root / "store"
    data = [w[k] for k in ("beir", "sts05", "pos", "labelled")]
    r = cli("featurize", "--model", w["model"], *[x for d in data for x in ("--data", d)],
            "--store", w["store"], "--dtype", "float32")
    assert r.exit_code == 0, r.output
    w["head"] = root / "head-pos"  # one trained head (positives-only pairs) for the eval tests
    r = cli("train-head", "--store", w["store"], "--data", w["pos"], "--out", w["head"], *FAST)
    assert r.exit_code == 0, r.output
    return w


FAST = ("--epochs", "1", "--hidden", "16", "--batch-size", "8", "--mined-k", "2")


def write_json_lines(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def real_dataset():
    """real_dataset("scifact") -> path under ../shared/datasets ($HEADSTORE_DATA), or skip when absent."""
    root = Path(os.environ.get("HEADSTORE_DATA", Path(__file__).resolve().parents[2].parent / "shared" / "datasets"))

    def find(name: str) -> Path:
        if not (root / name).exists():
            pytest.skip(f"real dataset {root / name} not present (set HEADSTORE_DATA)")
        return root / name
    return find


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> World:
    """A tiny random BERT, a BEIR folder, a float32 store of it and a trained head (see api_world)."""
    return World(tmp_path_factory.mktemp("api-world"))
