"""Given negatives in a labelled pairs table (anchor, positive, label, negative; issue 32 item 5): every path
that reads a task's rows reads the negatives too (train-head, eval, grid, finetune), and a row outside the rows
read is an error even under `python -O`, never another text."""
import random

import numpy as np
import polars as pl
import pytest
import torch

from headstore.featurize.store.reader import FeatureStore
from headstore.heads.kinds import load_task
from headstore.heads.artefacts.task_features import TaskFeatures

from .conftest import FAST, cli
from .finetune_world import sentence, tiny_bert


@pytest.fixture(scope="module")
def negatives_world(tmp_path_factory):
    """A labelled pairs table whose negatives are texts that are no anchor or positive, and a store of it and
    of other texts."""
    root = tmp_path_factory.mktemp("negatives")
    rng = random.Random(5)
    n = 60
    table = pl.DataFrame({"anchor": [sentence(rng) + f" {i}" for i in range(n)],
                          "positive": [sentence(rng) + f" {i + 100}" for i in range(n)],
                          "label": [i % 2 for i in range(n)],
                          "negative": [sentence(rng) + f" {i + 200}" for i in range(n)],
                          "split": ["train"] * 36 + ["dev"] * 12 + ["test"] * 12})
    data = root / "labelled-negatives.parquet"
    table.write_parquet(data)
    other = root / "other.txt"  # texts of no task: the rows read are then not the whole store
    other.write_text("".join(sentence(rng, 4) + f" {i + 300}\n" for i in range(40)))
    model = tiny_bert(root / "model", layers=1)
    store = root / "store"
    r = cli("featurize", "--model", model, "--data", other, "--data", data, "--store", store, "--dtype", "float32")
    assert r.exit_code == 0, r.output
    return {"root": root, "data": data, "model": model, "store": store, "table": table}


def test_remapped_negatives_point_at_the_negative_texts_features(negatives_world):
    w = negatives_world
    store = FeatureStore.open(w["store"])
    task = load_task(str(w["data"]), store)
    assert task.kind == "pairs" and task.train.negative is not None
    tf = TaskFeatures.for_task(store, task)
    remapped, X = tf.remap(task), tf.read()
    train = w["table"].filter(pl.col("split") == "train")
    reference = store.features(store.rows_for(store.row_ids(train["negative"].to_list(), "document")))
    assert np.array_equal(X[torch.as_tensor(remapped.train.negative[:, 0])].numpy(), reference)
    assert len(tf) < store.n_texts  # only the task's rows were read (the remap is not the identity)


def test_train_head_eval_grid_and_finetune_read_the_given_negatives(negatives_world, tmp_path):
    w = negatives_world
    head = tmp_path / "head"
    r = cli("train-head", "--store", w["store"], "--data", w["data"], "--out", head, *FAST)  # l1-energy: labels
    assert r.exit_code == 0 and r.exception is None, r.output
    r = cli("eval", "--store", w["store"], "--head", head, "--data", w["data"], "--out", tmp_path / "eval")
    assert r.exit_code == 0 and r.exception is None, r.output
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nloss = ["mnr", "l1-energy"]\n[fixed]\nepochs = 1\nhidden = 16\nbatch_size = 8\n')
    r = cli("grid", "--store", w["store"], "--data", w["data"], "--grid", grid, "--out", tmp_path / "grid")
    assert r.exit_code == 0 and r.exception is None, r.output
    assert pl.read_parquet(tmp_path / "grid" / "results.parquet").height == 2
    r = cli("finetune", "--head", head, "--out", tmp_path / "ft", "--model", w["model"], "--max-steps", "1",
            "--batch-size", "4", "--device", "cpu")
    assert r.exit_code == 0 and r.exception is None, r.output


def test_a_row_outside_the_rows_read_is_an_error_not_an_assert():
    """`positions` refuses a row it did not read by a check that raises LookupError, not by an assert (which
    `python -O` removes: the row would then silently become the next row read)."""
    tf = TaskFeatures(None, np.array([2, 5, 9]))
    assert tf.positions([9, 2]).tolist() == [2, 0]
    with pytest.raises(LookupError, match=r"store rows \[6\] are not among the 3 rows read"):
        tf.positions([5, 6])
