"""Format detection, load_dataset, Dataset.texts/splits — on small files and on the real datasets."""

from __future__ import annotations

import json
import time

import polars as pl
import pytest

from headstore.data.dataset import FORMATS, Dataset, detect_format, load_dataset, resolve_data_path
from headstore.data.errors import DataError
from headstore.data.text_id import doc_text


def write_beir(folder):
    folder.mkdir()
    (folder / "corpus.jsonl").write_text(
        json.dumps({"_id": "d1", "title": "T1", "text": "body one"}) + "\n"
        + json.dumps({"_id": "d2", "title": "", "text": "shared text"}) + "\n"
        + json.dumps({"_id": "d3", "title": "T1", "text": "body one"}) + "\n")  # same doc_text as d1
    (folder / "queries.jsonl").write_text(
        json.dumps({"_id": "q1", "text": "shared text"}) + "\n"
        + json.dumps({"_id": "q2", "text": "a question"}) + "\n")
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td2\t1\n")
    (folder / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nq2\td1\t1\n")
    return folder


def test_formats_registry():
    assert sorted(FORMATS) == ["beir", "labels", "pairs", "sts", "text"]


def test_detect_format_by_layout_and_columns(tmp_path):
    assert detect_format(write_beir(tmp_path / "ir")) == "beir"
    pl.DataFrame({"sentence1": ["a"], "sentence2": ["b"], "score": [1.0]}).write_parquet(tmp_path / "s.parquet")
    assert detect_format(tmp_path / "s.parquet") == "sts"
    (tmp_path / "s.tsv").write_text("sentence1\tsentence2\tscore\na\tb\t1\n")
    assert detect_format(tmp_path / "s.tsv") == "sts"
    (tmp_path / "p.csv").write_text("anchor,positive\na,b\n")
    assert detect_format(tmp_path / "p.csv") == "pairs"
    (tmp_path / "p.jsonl").write_text(json.dumps({"anchor": "a", "positive": "b"}) + "\n")
    assert detect_format(tmp_path / "p.jsonl") == "pairs"
    pl.DataFrame({"sentence1": ["a"], "sentence2": ["b"], "label": [1]}).write_parquet(tmp_path / "l.parquet")
    assert detect_format(tmp_path / "l.parquet") == "pairs"  # labelled pairs, no score
    (tmp_path / "t.txt").write_text("x\n")
    assert detect_format(tmp_path / "t.txt") == "text"
    pl.DataFrame({"text": ["x"]}).write_parquet(tmp_path / "t.parquet")
    assert detect_format(tmp_path / "t.parquet") == "text"
    pl.DataFrame({"passage": ["x"], "n": [1]}).write_parquet(tmp_path / "one_string.parquet")
    assert detect_format(tmp_path / "one_string.parquet") == "text"


def test_detect_format_unclear_lists_formats(tmp_path):
    pl.DataFrame({"a": ["x"], "b": ["y"]}).write_parquet(tmp_path / "odd.parquet")
    with pytest.raises(ValueError, match="valid formats: beir, labels, pairs, sts, text; name one with --format"):
        detect_format(tmp_path / "odd.parquet")
    (tmp_path / "odd.csv").write_text("text\nx\n")  # text format reads .txt or Parquet only
    with pytest.raises(ValueError, match="--format"):
        detect_format(tmp_path / "odd.csv")
    with pytest.raises(FileNotFoundError):
        detect_format(tmp_path / "nothing-here")


def test_folder_with_one_data_file_resolves_to_it(tmp_path):
    folder = tmp_path / "stsb"
    folder.mkdir()
    (folder / "README.md").write_text("# readme")
    (folder / "LICENSE.txt").write_text("licence text")
    pl.DataFrame({"sentence1": ["a", "c"], "sentence2": ["b", "a"], "score": [1.0, 2.0],
                  "split": ["train", "test"]}).write_parquet(folder / "stsb.parquet")
    assert resolve_data_path(folder) == folder / "stsb.parquet"
    ds = load_dataset(folder)
    assert (ds.name, ds.kind, ds.path) == ("stsb", "sts", folder / "stsb.parquet")
    assert ds.texts() == ["a", "c", "b"]  # sentence1 column, then sentence2, unique
    assert ds.splits() == ["test", "train"]


def test_folder_with_several_data_files_asks_for_one(tmp_path):
    for name in ("a.parquet", "b.parquet"):
        pl.DataFrame({"anchor": ["x"], "positive": ["y"]}).write_parquet(tmp_path / name)
    with pytest.raises(ValueError, match=r"several data files \(a.parquet, b.parquet\); name the one"):
        load_dataset(tmp_path)
    assert load_dataset(tmp_path / "b.parquet").name == "b"


def test_load_beir_texts_and_splits(tmp_path):
    ds = load_dataset(write_beir(tmp_path / "tiny-ir"))
    assert isinstance(ds, Dataset) and (ds.name, ds.kind) == ("tiny-ir", "beir")
    assert sorted(ds.frames) == ["corpus", "qrels/dev", "qrels/test", "queries"]
    assert ds.splits() == ["dev", "test"]
    assert ds.qrels["test"].rows() == [("q1", "d2", 1)]
    assert ds.beir.corpus["_id"].to_list() == ["d1", "d2", "d3"] and sorted(ds.beir.qrels) == ["dev", "test"]
    # docs as doc_text, then queries; "shared text" (doc d2 and query q1) and d1==d3 appear once
    assert ds.texts() == [doc_text("T1", "body one"), "shared text", "a question"]
    with pytest.raises(ValueError, match="several frames"):
        ds.frame


def test_load_pairs_texts_include_negatives(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"anchor": "a", "positive": "b", "negative": "c"}) + "\n"
                    + json.dumps({"anchor": "b", "positive": "d", "negative": "a"}) + "\n")
    ds = load_dataset(path)
    assert ds.texts() == ["a", "b", "d", "c"]  # anchors a b, positives (b) d, negatives c (a)
    assert ds.splits() == ["train"]


def test_load_text_reports_skipped(tmp_path):
    pl.DataFrame({"text": ["x", "", "y", "x"]}).write_parquet(tmp_path / "t.parquet")
    ds = load_dataset(tmp_path / "t.parquet")
    assert (ds.kind, ds.skipped, ds.texts()) == ("text", 1, ["x", "y"])


def test_explicit_format(tmp_path):
    pl.DataFrame({"sentence1": ["a"], "sentence2": ["b"], "score": [1.0]}).write_parquet(tmp_path / "s.parquet")
    assert load_dataset(tmp_path / "s.parquet", format="pairs").frame.columns[:2] == ["anchor", "positive"]
    with pytest.raises(ValueError, match="unknown format 'csv'; valid formats: beir, labels, pairs, sts, text"):
        load_dataset(tmp_path / "s.parquet", format="csv")
    with pytest.raises(ValueError, match="beir format reads a folder"):
        load_dataset(tmp_path / "s.parquet", format="beir")
    qrels = write_beir(tmp_path / "ir") / "qrels" / "test.tsv"
    with pytest.raises(DataError, match="missing column.s. sentence1, sentence2; the file has query-id"):
        load_dataset(qrels, format="sts")


# ---- real datasets (skipped when ../shared/datasets is absent) ---------------------------------

@pytest.mark.slow
def test_real_scifact(real_dataset):
    start = time.perf_counter()
    ds = load_dataset(real_dataset("scifact"))
    seconds = time.perf_counter() - start
    assert ds.kind == "beir"
    assert ds.frames["corpus"].height == 5183 and ds.frames["queries"].height == 1109
    assert ds.qrels["train"].height == 919 and ds.qrels["test"].height == 339
    assert ds.qrels["train"]["query_id"].n_unique() == 809
    assert ds.qrels["test"]["query_id"].n_unique() == 300
    assert seconds < 2.0, f"reading scifact took {seconds:.2f}s"
    assert len(ds.texts()) <= 5183 + 1109


@pytest.mark.slow
@pytest.mark.parametrize("name, docs, queries, judged", [("cacm", 3204, 64, 796),
                                                         ("cranfield", 1400, 225, 1837)])
def test_real_classic_ir(real_dataset, name, docs, queries, judged):
    ds = load_dataset(real_dataset(name))
    assert (ds.frames["corpus"].height, ds.frames["queries"].height) == (docs, queries)
    assert ds.splits() == ["test"] and ds.qrels["test"].height == judged


@pytest.mark.slow
def test_real_stsb_folder(real_dataset):
    ds = load_dataset(real_dataset("stsb"))  # folder: stsb.parquet beside README.md, LICENSE.txt
    assert (ds.kind, ds.name) == ("sts", "stsb")
    counts = dict(ds.frame["split"].value_counts().rows())
    assert counts == {"train": 5749, "dev": 1500, "test": 1379}
    assert ds.frame["score"].min() >= 0 and ds.frame["score"].max() <= 5
    assert {"genre", "source_file"} <= set(ds.frame.columns)


@pytest.mark.slow
def test_real_semeval(real_dataset):
    ds = load_dataset(real_dataset("semeval-sts-2012-2016"))
    assert ds.kind == "sts" and ds.frame.height == 13278


@pytest.mark.slow
@pytest.mark.parametrize("file, rows", [("mrpc_pairs", 2407 + 346 + 1147), ("mrpc_labeled", 3576 + 500 + 1725),
                                        ("trecqa_pairs", 348 + 222 + 284),
                                        ("trecqa_labeled", 4718 + 1148 + 1517)])
def test_real_pairs_small(real_dataset, file, rows):
    ds = load_dataset(real_dataset("pairs-small") / f"{file}.parquet")
    assert ds.kind == "pairs" and ds.frame.height == rows
    assert ds.splits() == ["dev", "test", "train"]


@pytest.mark.slow
def test_real_pairs_small_folder_needs_a_file(real_dataset):
    with pytest.raises(ValueError, match="several data files"):
        load_dataset(real_dataset("pairs-small"))


@pytest.mark.slow
def test_real_text_datasets(real_dataset):
    wiki = load_dataset(real_dataset("wikitext-2"))
    assert wiki.kind == "text" and wiki.frame.height == 2461 + 2891
    assert wiki.splits() == ["test", "validation"]
    news = load_dataset(real_dataset("20newsgroups"))
    assert news.kind == "labels" and news.frame.height == 18846 and "label" in news.frame.columns  # text + label
