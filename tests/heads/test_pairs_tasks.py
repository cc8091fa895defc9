"""The user's own pair files: positives-only pairs are retrieval, labelled pairs are classification, dev is
carved by text, a table without splits is scored whole."""
import json

import numpy as np
import polars as pl
import pytest

from headstore.data.text_id import text_id
from headstore.heads.kinds import load_task
from headstore.heads.kinds.base import carve_dev
from headstore.heads.kinds.ranking import IRSplit

from .conftest import FAST, cli


class TextStore:
    """Stands in for a FeatureStore: every text is a row, numbered in order of first sight."""

    prompts = {"query": "", "document": ""}

    def __init__(self):
        self.row_of: dict[str, int] = {}
        self.fingerprint = "test"

    def row_ids(self, texts, role="document"):
        return [text_id(t) for t in texts]

    def rows_for(self, ids):
        return np.array([self.row_of.setdefault(i, len(self.row_of)) for i in ids], dtype=np.int64)


def test_positive_pairs_become_retrieval_over_the_splits_positives(tmp_path):
    path = tmp_path / "pairs.parquet"
    pl.DataFrame({"anchor": ["q1", "q1", "q2", "q3", "v1", "t1", "t1", "t2", "t3"],
                  "positive": ["a", "b", "b", "c", "e", "x", "y", "y", "t1"],  # t1 is also t3's positive
                  "split": ["train"] * 4 + ["dev"] + ["test"] * 4}).write_parquet(path)
    store = TextStore()
    task = load_task(str(path), store)
    assert task.kind == "ir" and "ranks all positives of its split" in task.evaluation
    test = task.eval_sets["test"]
    assert isinstance(test, IRSplit) and test.exclude_self
    assert sorted(test.doc_ids) == sorted(text_id(t) for t in ["x", "y", "t1"])  # identical texts: one doc
    assert test.qrels[text_id("t1")] == {text_id("x"): 1, text_id("y"): 1}  # two positives, two relevant docs
    assert test.qrels[text_id("t3")] == {text_id("t1"): 1}
    # training: the pairs themselves, impostors mined from the train positives only
    assert len(task.train) == 4 and task.train.labels is None
    rows = store.rows_for([text_id(t) for t in ["a", "b", "c"]])
    assert sorted(task.corpus_rows.tolist()) == sorted(rows.tolist())
    assert (store.rows_for([text_id("q1")])[0], rows[1]) in task.relevant


def test_labelled_pairs_stay_classification_and_need_both_classes(tmp_path):
    path = tmp_path / "pairs.parquet"
    frame = pl.DataFrame({"sentence1": [f"a{i}" for i in range(10)], "sentence2": [f"b{i}" for i in range(10)],
                          "label": [1, 0, 1, 0, 1, 0, 1, 0, 1, 1], "split": ["train"] * 4 + ["dev"] * 2 + ["test"] * 4})
    frame.write_parquet(path)
    task = load_task(str(path), TextStore())
    assert task.kind == "pairs" and task.eval_sets["test"].labels.tolist() == [1, 0, 1, 1]
    frame.with_columns(pl.lit(1).alias("label")).write_parquet(path)  # every label 1: positives only
    assert load_task(str(path), TextStore()).kind == "ir"
    frame.with_columns(pl.Series("label", [1, 0, 1, 0, 1, 0, 1, 1, 1, 1])).write_parquet(path)
    with pytest.raises(ValueError, match="split 'test'.*every pair is labelled positive"):
        load_task(str(path), TextStore())


def test_dev_is_carved_by_text():
    rng = np.random.default_rng(0)
    items = [[f"q{i}", f"d{rng.integers(0, 60)}"] for i in range(300)]  # docs shared by several queries
    is_dev, dropped, note = carve_dev(items, "pairs")
    dev_texts = {t for i in np.flatnonzero(is_dev) for t in items[i]}
    train_texts = {t for i in np.flatnonzero(~is_dev & ~dropped) for t in items[i]}
    assert not dev_texts & train_texts and not dropped.any()
    assert 20 <= is_dev.sum() <= 30 and "held out by text" in note
    again = carve_dev(items, "pairs")[0]
    assert (again == is_dev).all()  # the same dev slice on every run


def test_dev_carving_drops_and_counts_when_texts_do_not_split():
    items = [[f"t{i}", f"t{i + 1}"] for i in range(50)]  # a chain: one group holding every pair
    is_dev, dropped, note = carve_dev(items, "pairs")
    dev_texts = {t for i in np.flatnonzero(is_dev) for t in items[i]}
    train_texts = {t for i in np.flatnonzero(~is_dev & ~dropped) for t in items[i]}
    assert is_dev.sum() == 5 and 1 <= dropped.sum() <= 10 and not dev_texts & train_texts
    assert f"{int(dropped.sum())} train pairs sharing a text with dev were dropped" in note
    with pytest.raises(ValueError, match="no dev set can be held out"):
        carve_dev([["hub", "a"], ["hub", "b"], ["hub", "c"]], "pairs")


def test_table_without_dev_carves_by_text_and_records_it(data_world, tmp_path):
    out = tmp_path / "h"
    r = cli("train-head", "--store", data_world["store"], "--data", data_world["nosplit"], "--out", out, *FAST)
    assert r.exit_code == 0, r.output
    m = json.loads((out / "metrics.json").read_text())
    assert "held out by text" in m["dev_made"] and "no dev text appears in a train pair" in m["dev_made"]
    assert m["split"] == "dev" and "no test split" in m["note"]
    store = TextStore()
    task = load_task(str(data_world["nosplit"]), store)
    dev = task.eval_sets["dev"]
    train_rows = set(task.train.anchor.tolist()) | set(task.train.positive.tolist())
    assert not (set(dev.query_rows.tolist()) | set(dev.doc_rows.tolist())) & train_rows


@pytest.mark.parametrize("loss", ["mnr", "l1-energy"])
def test_positive_pairs_train_and_report_ir_metrics_beside_the_baseline(data_world, tmp_path, loss):
    out = tmp_path / "h"
    r = cli("train-head", "--store", data_world["store"], "--data", data_world["pos"], "--out", out, "--loss", loss, *FAST)
    assert r.exit_code == 0, r.output
    m = json.loads((out / "metrics.json").read_text())
    prefix = "cosine" if loss == "mnr" else "manhattan"
    assert m["primary"] == f"{prefix}_ndcg@10" and m["baseline_primary"] == "cosine_ndcg@10"
    assert {"cosine_ndcg@10", "manhattan_mrr@10", "cosine_recall@100"} <= set(m["baseline"])
    assert 0 <= m["head"][f"{prefix}_ndcg@10"] <= 1 and len(m["ci"]["head"]) == 2
    anchors = pl.read_parquet(data_world["pos"]).filter(pl.col("split") == "test")["anchor"]
    assert m["n_scored"]["test"] == anchors.n_unique()
    assert "retrieval" in m["evaluation"]


def test_labelled_pairs_report_auc_with_a_ci(data_world, tmp_path):
    out = tmp_path / "h"
    r = cli("train-head", "--store", data_world["store"], "--data", data_world["labelled"], "--out", out, *FAST)
    assert r.exit_code == 0, r.output
    m = json.loads((out / "metrics.json").read_text())
    assert m["primary"] == "manhattan_auc" and "manhattan_f1" in m["head"]
    lo, hi = m["ci"]["head"]
    assert lo <= m["head"]["manhattan_auc"] <= hi


@pytest.mark.parametrize("data", ["nosplit", "sts05-nosplit"])
def test_eval_scores_a_table_without_split_column_whole(data_world, tmp_path, data):
    if data == "sts05-nosplit":
        path = tmp_path / "sts.parquet"
        pl.read_parquet(data_world["sts05"]).drop("split").write_parquet(path)
        n = pl.read_parquet(path).height
    else:
        path = data_world["nosplit"]
        n = pl.read_parquet(path)["anchor"].n_unique()
    r = cli("eval", "--store", data_world["store"], "--head", data_world["head"], "--data", path, "--out", tmp_path / "e")
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert m["split"] == "all" and m["n_scored"] == {"all": n}


def test_grid_transfer_scores_a_table_without_split_column_whole(data_world, tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nlr = [1e-3]\n[fixed]\nepochs = 1\nhidden = 16\nbatch_size = 8\nmined_k = 2\n')
    sts = tmp_path / "ood.parquet"
    pl.read_parquet(data_world["sts05"]).drop("split").write_parquet(sts)
    r = cli("grid", "--store", data_world["store"], "--data", data_world["pos"], "--grid", grid,
            "--out", tmp_path / "g", "--transfer", sts)
    assert r.exit_code == 0, r.output
    row = pl.read_parquet(tmp_path / "g" / "results.parquet").row(0, named=True)
    assert len(json.loads(row["ood_ood_items"])) == 60  # every row of the table, not a dev slice
    assert -1 <= row["ood_ood_primary"] <= 1


def test_ir_dev_is_carved_by_query_text_and_documents_stay_shared(data_world):
    """BEIR without a dev split: dev queries are train queries held out by their text (none is a train
    anchor); documents are the corpus every split ranks, so dev may share relevant documents with train."""
    task = load_task(str(data_world["beir"]), TextStore())
    dev = task.eval_sets["dev"]
    assert isinstance(dev, IRSplit) and len(dev.query_ids) >= 1
    assert not set(dev.query_rows.tolist()) & set(task.train.anchor.tolist())
    assert len(dev.doc_rows) == len(task.eval_sets["test"].doc_rows)  # the whole corpus
    assert "documents are the shared corpus" in task.dev_note
