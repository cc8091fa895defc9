"""`--data` takes a folder written by Hugging Face `datasets` (`save_to_disk` of a DatasetDict or a Dataset):
the same task, and the same metrics.json numbers, as the equivalent Parquet table; damaged folders are named."""
from __future__ import annotations

import json
import random
import shutil

import polars as pl
import pytest

from headstore.data.dataset import detect_format, load_dataset

from .conftest import FAST, cli
from .finetune_world import sentence, tiny_bert

datasets = pytest.importorskip("datasets")

SPLITS = {"train": "train", "dev": "validation", "test": "test"}  # the table's split -> the DatasetDict's


def save_dict(frame: pl.DataFrame, folder):
    """The table as a DatasetDict (train/validation/test, no split column), saved to `folder`."""
    parts = {SPLITS[s]: datasets.Dataset.from_polars(frame.filter(pl.col("split") == s).drop("split"))
             for s in ("train", "dev", "test")}
    datasets.DatasetDict(parts).save_to_disk(str(folder))
    return folder


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    rng = random.Random(5)
    n = 48
    split = ["train"] * 24 + ["dev"] * 12 + ["test"] * 12
    sts = pl.DataFrame({"sentence1": [sentence(rng) + f" a{i}" for i in range(n)],
                        "sentence2": [sentence(rng) + f" b{i}" for i in range(n)],
                        "score": [rng.uniform(0, 5) for _ in range(n)], "split": split})
    pairs = pl.DataFrame({"anchor": [sentence(rng, 3) + f" q{i}" for i in range(n)],
                          "positive": [sentence(rng, 5) + f" p{i}" for i in range(n)], "split": split})
    labels = pl.DataFrame({"text": [sentence(rng) + f" t{i}" for i in range(n)],
                           "label": [f"c{i % 3}" for i in range(n)], "split": split})
    w = {"root": root, "model": tiny_bert(root / "model", layers=2)}
    for name, frame in (("sts", sts), ("pairs", pairs), ("labels", labels)):
        w[f"{name}.parquet"] = root / f"{name}.parquet"
        frame.write_parquet(w[f"{name}.parquet"])
        w[f"{name}.hf"] = save_dict(frame, root / f"{name}-hf")
    return w


@pytest.mark.parametrize("name", ["sts", "pairs", "labels"])
def test_a_datasetdict_folder_is_the_parquet_table(tables, name, tmp_path):
    hf, parquet = tables[f"{name}.hf"], tables[f"{name}.parquet"]
    assert detect_format(hf) == detect_format(parquet) == name
    a, b = load_dataset(hf), load_dataset(parquet)
    assert a.kind == b.kind and a.texts() == b.texts()
    assert sorted(a.frame["split"].unique().to_list()) == ["dev", "test", "train"]  # validation is dev
    r = cli("featurize", "--model", tables["model"], "--data", hf, "--store", tmp_path / "s", "--dtype", "float32")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["n_encoded"] == len(b.texts())
    r = cli("featurize", "--model", tables["model"], "--data", parquet, "--store", tmp_path / "s", "--dtype", "float32")
    assert r.exit_code == 0 and json.loads(r.stdout)["n_encoded"] == 0  # the same texts: nothing new
    metrics = []
    for data, out in ((hf, tmp_path / "head-hf"), (parquet, tmp_path / "head-parquet")):
        r = cli("train-head", "--store", tmp_path / "s", "--data", data, "--out", out, *FAST)
        assert r.exit_code == 0, r.output
        metrics.append(json.loads((out / "metrics.json").read_text()))
    for key in ("baseline", "head", "dev"):
        assert metrics[0][key] == metrics[1][key]


def test_a_single_dataset_folder_and_damaged_folders(tables, tmp_path):
    frame = pl.read_parquet(tables["sts.parquet"])
    single = tmp_path / "single"
    datasets.Dataset.from_polars(frame).save_to_disk(str(single))  # one Dataset: its own split column
    assert load_dataset(single).frame.height == frame.height and detect_format(single) == "sts"
    damaged = tmp_path / "damaged"
    shutil.copytree(tables["pairs.hf"], damaged)
    for arrow in (damaged / "test").glob("*.arrow"):
        arrow.unlink()
    r = cli("featurize", "--model", tables["model"], "--data", damaged, "--store", tmp_path / "s")
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert "damaged" in r.output and "load_from_disk" in r.output
    wrong = tmp_path / "wrong"
    save_dict(pl.read_parquet(tables["pairs.parquet"]).rename({"anchor": "question"}), wrong)
    r = cli("featurize", "--model", tables["model"], "--data", wrong, "--store", tmp_path / "s")
    assert r.exit_code != 0 and "cannot tell the format from its columns (question, positive, split)" in r.output
