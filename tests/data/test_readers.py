"""Readers: round trips on small files written here, and one test per kind of malformed input
checking that the error names the file and the exact line (text files) or row (Parquet)."""

from __future__ import annotations

import json
import logging
import math
import re

import polars as pl
import pytest

from headstore.data.errors import DataError
from headstore.data.readers import BeirData, read_beir, read_pairs, read_sts, read_text, read_text_counted


# ---- helpers ------------------------------------------------------------------------------------

def write_jsonl(path, records, raw_lines=()):
    lines = [json.dumps(r) for r in records] + list(raw_lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def make_beir(folder, corpus=None, queries=None, qrels=None, crlf=False):
    """A valid tiny BEIR folder; each part can be replaced by a list of raw lines."""
    folder.mkdir(exist_ok=True)
    corpus = corpus if corpus is not None else [
        json.dumps({"_id": "d1", "title": "First", "text": "Alpha text."}),
        json.dumps({"_id": 2, "text": "No title here."}),  # numeric id, title missing
        json.dumps({"_id": "d3", "title": "Third", "text": "", "metadata": {}}),
    ]
    queries = queries if queries is not None else [
        json.dumps({"_id": "q1", "text": "what is alpha"}),
        json.dumps({"_id": 7, "text": "second query"}),
    ]
    qrels = qrels if qrels is not None else {
        "test": ["query-id\tcorpus-id\tscore", "q1\td1\t1", "7\t2\t2", "7\td3\t0"],
        "train": ["query-id\tcorpus-id\tscore", "q1\t2\t1"],
    }
    (folder / "corpus.jsonl").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    (folder / "queries.jsonl").write_text("\n".join(queries) + "\n", encoding="utf-8")
    (folder / "qrels").mkdir(exist_ok=True)
    end = "\r\n" if crlf else "\n"
    for split, lines in qrels.items():
        (folder / "qrels" / f"{split}.tsv").write_bytes((end.join(lines) + end).encode())
    return folder


def raises_at(path, where, match=None):
    """pytest.raises for a DataError whose message starts with the file and place."""
    prefix = f"{path}:{where}: " if isinstance(where, int) else f"{path}: {where}: "
    return pytest.raises(DataError, match=re.escape(prefix) + (match or ""))


# ---- BEIR ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("crlf", [False, True])
def test_read_beir_round_trip(tmp_path, crlf):
    data = read_beir(make_beir(tmp_path / "ds", crlf=crlf))
    assert isinstance(data, BeirData) and data.path == tmp_path / "ds"
    assert data.corpus.columns == ["_id", "title", "text"]
    assert data.corpus.rows() == [("d1", "First", "Alpha text."), ("2", "", "No title here."),
                                  ("d3", "Third", "")]
    assert data.queries.rows() == [("q1", "what is alpha"), ("7", "second query")]
    assert sorted(data.qrels) == ["test", "train"]
    test = data.qrels["test"]
    assert test.columns == ["query_id", "corpus_id", "score"]
    assert test.schema["score"] == pl.Int64 and test.schema["query_id"] == pl.String
    assert test.rows() == [("q1", "d1", 1), ("7", "2", 2), ("7", "d3", 0)]
    assert data.qrels["train"].rows() == [("q1", "2", 1)]


def test_read_beir_skips_blank_lines_and_keeps_line_numbers(tmp_path):
    corpus = [json.dumps({"_id": "d1", "text": "a"}), "", "   ", json.dumps({"_id": "d1", "text": "b"})]
    folder = make_beir(tmp_path / "ds", corpus=corpus, qrels={})
    with raises_at(folder / "corpus.jsonl", 4, "duplicate \"_id\" 'd1' \\(first at line 1\\)"):
        read_beir(folder)


@pytest.mark.parametrize("bad_line, problem", [
    ('{"_id": "d9", "text": "unterminated', "invalid JSON"),
    ('["_id", "d9"]', "expected a JSON object"),
    ('{"title": "t", "text": "no id"}', 'missing "_id"'),
    ('{"_id": "d9", "title": "no text"}', 'missing "text"'),
    ('{"_id": "d9", "text": 42}', '"text" must be a string'),
    ('{"_id": "d9", "title": ["x"], "text": "t"}', '"title" must be a string'),
    ('{"_id": null, "text": "t"}', '"_id" must be a string or integer'),
    ('{"_id": "d1", "text": "dup"}', "duplicate \"_id\" 'd1'"),
])
def test_read_beir_corpus_errors_name_file_and_line(tmp_path, bad_line, problem):
    corpus = [json.dumps({"_id": "d1", "text": "a"}), json.dumps({"_id": "d2", "text": "b"}), bad_line]
    folder = make_beir(tmp_path / "ds", corpus=corpus, qrels={})
    with raises_at(folder / "corpus.jsonl", 3, re.escape(problem)):
        read_beir(folder)


def test_read_beir_query_errors(tmp_path):
    queries = [json.dumps({"_id": "q1", "text": "fine"}), json.dumps({"_id": "q2", "text": "  "})]
    folder = make_beir(tmp_path / "ds", queries=queries, qrels={})
    with raises_at(folder / "queries.jsonl", 2, "query 'q2' has empty text"):
        read_beir(folder)


def test_read_beir_keeps_empty_documents_with_a_warning(tmp_path, caplog):
    corpus = [json.dumps({"_id": "d1", "text": "a"}), json.dumps({"_id": "d2", "title": "", "text": ""})]
    folder = make_beir(tmp_path / "ds", corpus=corpus, qrels={})
    with caplog.at_level(logging.WARNING):
        data = read_beir(folder)
    assert data.corpus["_id"].to_list() == ["d1", "d2"]
    assert "1 document(s) with empty title and text (line 2)" in caplog.text


@pytest.mark.parametrize("bad_row, problem", [
    ("q1\td1", "expected 3 tab-separated fields"),
    ("q1\td1\t1\textra", "expected 3 tab-separated fields"),
    ("q1 d1 1", "expected 3 tab-separated fields"),
    ("q1\td1\t1.5", "score must be an integer, got '1.5'"),
    ("q1\td1\thigh", "score must be an integer, got 'high'"),
    ("q404\td1\t1", "query id 'q404' is not in queries.jsonl"),
    ("q1\tdoc404\t1", "corpus id 'doc404' is not in corpus.jsonl"),
    ("q1\td1\t1", "duplicate judgement for query 'q1', document 'd1' (first at line 2)"),
])
@pytest.mark.parametrize("crlf", [False, True])
def test_read_beir_qrels_errors_name_file_and_line(tmp_path, bad_row, problem, crlf):
    qrels = {"test": ["query-id\tcorpus-id\tscore", "q1\td1\t1", "7\t2\t1", bad_row]}
    folder = make_beir(tmp_path / "ds", qrels=qrels, crlf=crlf)
    with raises_at(folder / "qrels" / "test.tsv", 4, re.escape(problem)):
        read_beir(folder)


def test_read_beir_qrels_header_required(tmp_path):
    folder = make_beir(tmp_path / "ds", qrels={"dev": ["q1\td1\t1"]})
    with raises_at(folder / "qrels" / "dev.tsv", 1, "expected the header"):
        read_beir(folder)


@pytest.mark.parametrize("missing", ["corpus.jsonl", "queries.jsonl"])
def test_read_beir_missing_file(tmp_path, missing):
    folder = make_beir(tmp_path / "ds")
    (folder / missing).unlink()
    with pytest.raises(DataError, match=re.escape(f"{folder / missing}: no such file")):
        read_beir(folder)


def test_read_beir_invalid_utf8_names_line(tmp_path):
    folder = make_beir(tmp_path / "ds", qrels={})
    with open(folder / "corpus.jsonl", "ab") as f:
        f.write(b'{"_id": "d9", "text": "\xff\xfe"}\n')
    with raises_at(folder / "corpus.jsonl", 4, "not valid UTF-8"):
        read_beir(folder)


# ---- STS ----------------------------------------------------------------------------------------

STS_ROWS = {"sentence1": ["A man plays.", 'He said "hi".', "Cats, dogs"],
            "sentence2": ["A man is playing.", "Hello", "Dogs and cats"],
            "score": [4.5, 1.0, 3.25], "split": ["train", "dev", "test"], "genre": ["x", "y", "z"]}


def write_table(path, columns: dict):
    """Write columns as Parquet/CSV/TSV/JSONL by suffix (TSV unquoted, as STS files are)."""
    frame = pl.DataFrame(columns)
    if path.suffix == ".parquet":
        frame.write_parquet(path)
    elif path.suffix == ".csv":
        frame.write_csv(path)
    elif path.suffix == ".tsv":
        lines = ["\t".join(frame.columns)] + ["\t".join("" if v is None else str(v) for v in row)
                                              for row in frame.rows()]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in frame.rows(named=True)))
    return path


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".tsv"])
def test_read_sts_round_trip_keeps_extra_columns(tmp_path, suffix):
    frame = read_sts(write_table(tmp_path / f"sts{suffix}", STS_ROWS))
    assert frame.columns == ["sentence1", "sentence2", "score", "split", "genre"]
    assert frame.schema["score"] == pl.Float64
    assert frame.to_dict(as_series=False) == STS_ROWS


def test_read_sts_without_split_is_train(tmp_path):
    rows = {k: v for k, v in STS_ROWS.items() if k != "split"}
    frame = read_sts(write_table(tmp_path / "sts.csv", rows))
    assert frame["split"].to_list() == ["train"] * 3


def test_read_sts_missing_columns_lists_them(tmp_path):
    path = write_table(tmp_path / "sts.parquet", {"sentence1": ["a"], "text_b": ["b"]})
    with pytest.raises(DataError, match=re.escape(f"{path}: missing column(s) sentence2, score; "
                                                  "the file has sentence1, text_b")):
        read_sts(path)


@pytest.mark.parametrize("column, value, problem", [
    ("sentence1", None, "sentence1 is missing (null)"),
    ("sentence2", "   ", "sentence2 is empty"),
    ("score", None, "score is missing"),
    ("score", float("nan"), "score is not finite"),
    ("score", float("inf"), "score is not finite"),
])
def test_read_sts_parquet_errors_name_row(tmp_path, column, value, problem):
    rows = {k: list(v) for k, v in STS_ROWS.items()}
    rows[column][2] = value
    path = write_table(tmp_path / "sts.parquet", rows)
    with raises_at(path, "row 2", re.escape(problem)):
        read_sts(path)


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
@pytest.mark.parametrize("column, value, problem", [
    ("sentence1", "", "sentence1 is empty"),
    ("score", "four", "score is not a number: 'four'"),
    ("score", "", "score is not a number: ''"),
    ("score", "inf", "score is not finite"),
])
def test_read_sts_text_file_errors_name_line(tmp_path, suffix, column, value, problem):
    rows = {k: [str(x) for x in v] for k, v in STS_ROWS.items()}
    rows[column][1] = value
    path = write_table(tmp_path / f"sts{suffix}", rows)
    with raises_at(path, 3, re.escape(problem)):  # data row 1 is line 3 (header is line 1)
        read_sts(path)


def test_read_sts_reports_how_many_rows_are_bad(tmp_path):
    rows = {k: list(v) for k, v in STS_ROWS.items()}
    rows["sentence2"][0] = rows["sentence2"][2] = ""
    path = write_table(tmp_path / "sts.parquet", rows)
    with raises_at(path, "row 0", re.escape("sentence2 is empty (2 rows have this problem")):
        read_sts(path)


def test_read_sts_ragged_tsv_row(tmp_path):
    path = tmp_path / "sts.tsv"
    path.write_text("sentence1\tsentence2\tscore\na\tb\t1\na\tb\t2\textra\n")
    with raises_at(path, 3, "expected 3 fields"):
        read_sts(path)


def test_read_csv_line_numbers_follow_quoted_newlines(tmp_path):
    path = tmp_path / "sts.csv"
    path.write_text('sentence1,sentence2,score\n"two\nlines",b,1\nc,d,oops\n')
    with raises_at(path, 4, "score is not a number: 'oops'"):
        read_sts(path)
    path.write_text('sentence1,sentence2,score\n"two\nlines",b,1\n')
    assert read_sts(path)["sentence1"].to_list() == ["two\nlines"]


def test_read_sts_non_text_sentence_column(tmp_path):
    path = write_table(tmp_path / "sts.parquet", {"sentence1": [1, 2], "sentence2": ["a", "b"],
                                                  "score": [1.0, 2.0]})
    with raises_at(path, "row 0", "sentence1 must be text"):
        read_sts(path)


def test_read_sts_rejects_unknown_suffix(tmp_path):
    path = tmp_path / "sts.xlsx"
    path.write_text("x")
    with pytest.raises(ValueError, match=r"unsupported file type '\.xlsx'; valid: \.parquet"):
        read_sts(path)


# ---- pairs --------------------------------------------------------------------------------------

PAIR_ROWS = {"anchor": ["q one", "q two", "q three"], "positive": ["p one", "p two", "p three"],
             "negative": ["n one", "n two", "n three"], "label": [1, 0, 1],
             "split": ["train", "train", "test"]}


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_read_pairs_round_trip(tmp_path, suffix):
    frame = read_pairs(write_table(tmp_path / f"pairs{suffix}", PAIR_ROWS))
    assert frame.columns == ["anchor", "positive", "negative", "label", "split"]
    assert frame.schema["label"] == pl.Float64
    expected = dict(PAIR_ROWS, label=[1.0, 0.0, 1.0])
    assert frame.to_dict(as_series=False) == expected


def test_read_pairs_defaults_label_and_split(tmp_path):
    frame = read_pairs(write_table(tmp_path / "p.jsonl", {"anchor": ["a", "b"], "positive": ["c", "d"]}))
    assert frame.columns == ["anchor", "positive", "label", "split"]
    assert frame["label"].to_list() == [1.0, 1.0]
    assert frame["split"].to_list() == ["train", "train"]


def test_read_pairs_float_labels_and_alias_columns(tmp_path):
    path = write_table(tmp_path / "p.parquet", {"sentence1": ["a", "b"], "sentence2": ["c", "d"],
                                                "label": [0.25, 0.9], "id": [5, 6]})
    frame = read_pairs(path)
    assert frame.columns == ["anchor", "positive", "label", "split", "id"]
    assert frame.rows() == [("a", "c", 0.25, "train", 5), ("b", "d", 0.9, "train", 6)]


@pytest.mark.parametrize("column, value, problem", [
    ("anchor", None, "anchor is missing (null)"),
    ("positive", "", "positive is empty"),
    ("negative", " \t", "negative is empty"),
    ("label", 2, "label must be 0 or 1 (or a float in [0, 1]), got 2"),
    ("split", None, "split is missing (null)"),
])
def test_read_pairs_parquet_errors_name_row(tmp_path, column, value, problem):
    rows = {k: list(v) for k, v in PAIR_ROWS.items()}
    rows[column][1] = value
    path = write_table(tmp_path / "p.parquet", rows)
    with raises_at(path, "row 1", re.escape(problem)):
        read_pairs(path)


def test_read_pairs_jsonl_errors_name_line(tmp_path):
    path = tmp_path / "p.jsonl"
    good = json.dumps({"anchor": "a", "positive": "b", "label": 1})
    path.write_text("\n".join([good, "", good, json.dumps({"anchor": "a", "label": 0})]) + "\n")
    with raises_at(path, 4, "positive is missing"):  # blank line 2 skipped, numbering kept
        read_pairs(path)
    path.write_text("\n".join([good, '{"anchor": "a", "positive": "b", "label": 1']) + "\n")
    with raises_at(path, 2, "invalid JSON"):
        read_pairs(path)
    path.write_text("\n".join([good, json.dumps({"anchor": 5, "positive": "b"})]) + "\n")
    with raises_at(path, 2, re.escape('"anchor" is int here but str at line 1')):
        read_pairs(path)
    path.write_text("\n".join([good, json.dumps({"anchor": "a", "positive": "b", "label": "yes"})]))
    with raises_at(path, 2, re.escape('"label" is str here but float at line 1')):
        read_pairs(path)


def test_read_pairs_csv_bad_label_names_line(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("anchor,positive,label\na,b,1\nc,d,maybe\n")
    with raises_at(path, 3, "label is not a number: 'maybe'"):
        read_pairs(path)


def test_read_pairs_missing_columns(tmp_path):
    path = write_table(tmp_path / "p.parquet", {"anchor": ["a"], "text": ["b"]})
    with pytest.raises(DataError, match=re.escape(f"{path}: missing columns anchor, positive")):
        read_pairs(path)


# ---- text ---------------------------------------------------------------------------------------

def test_read_text_txt_skips_blank_lines_and_strips(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b" First passage. \r\n\r\nSecond\n   \n\xc3\xa9t\xc3\xa9\n")
    frame = read_text(path)
    assert frame["text"].to_list() == ["First passage.", "Second", "été"]
    assert frame["split"].to_list() == ["train"] * 3


def test_read_text_txt_invalid_utf8_names_line(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"ok\nfine\nbad \xff byte\n")
    with raises_at(path, 3, "not valid UTF-8"):
        read_text(path)


def test_read_text_parquet_column_choice_and_extras(tmp_path):
    path = write_table(tmp_path / "t.parquet", {"text": ["full 1", "full 2"], "body": ["b1", "b2"],
                                                "label": [3, 4]})
    assert read_text(path).rows() == [("full 1", "train", "b1", 3), ("full 2", "train", "b2", 4)]
    frame = read_text(path, column="body")
    assert frame.columns == ["text", "split", "label"]
    assert frame["text"].to_list() == ["b1", "b2"]
    with pytest.raises(DataError, match="no column 'nope'; its text columns are text, body"):
        read_text(path, column="nope")


def test_read_text_parquet_single_string_column_is_used(tmp_path):
    path = write_table(tmp_path / "t.parquet", {"line": ["x", "y"], "n": [1, 2]})
    assert read_text(path)["text"].to_list() == ["x", "y"]


def test_read_text_parquet_null_names_row(tmp_path):
    path = write_table(tmp_path / "t.parquet", {"text": ["a", "b", None, "d"]})
    with raises_at(path, "row 2", re.escape("text is missing (null)")):
        read_text(path)


def test_read_text_parquet_empty_strings_are_counted_and_logged(tmp_path, caplog):
    path = write_table(tmp_path / "t.parquet", {"text": ["a", "", "c", "  "], "split": list("wxyz")})
    with caplog.at_level(logging.WARNING):
        frame, skipped = read_text_counted(path)
    assert skipped == 2
    assert frame.rows() == [("a", "w"), ("c", "y")]
    assert "skipped 2 empty 'text' value(s) (rows 1, 3)" in caplog.text


def test_read_text_rejects_other_suffixes(tmp_path):
    with pytest.raises(ValueError, match="reads .txt, .text, .parquet or a datasets folder"):
        read_text(tmp_path / "x.csv")


def test_sts_scores_parse_like_python_float(tmp_path):
    # reference: Python's float() on the same strings
    values = ["1", "2.5", " 3 ", "1e-1", "-0.0"]
    path = write_table(tmp_path / "s.csv", {"sentence1": ["a"] * 5, "sentence2": ["b"] * 5,
                                            "score": values})
    got = read_sts(path)["score"].to_list()
    assert all(math.isclose(g, float(v)) for g, v in zip(got, values))
