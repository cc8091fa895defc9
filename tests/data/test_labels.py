"""The labelled-text reader: detection, columns, hierarchies, and the errors a hostile file gets."""
import json
import logging

import polars as pl
import pytest

from headstore.data.dataset import detect_format, load_dataset
from headstore.data.errors import DataError
from headstore.data.labels import LabelSpec, label_format, read_labels_counted, unseen_labels


def _write(path, rows):
    pl.DataFrame(rows).write_parquet(path)
    return path


def test_detected_from_text_and_label_in_parquet_csv_jsonl(tmp_path):
    rows = {"text": ["a b", "c d", "e f"], "label": ["x", "y", "x"], "split": ["train", "train", "test"]}
    _write(tmp_path / "l.parquet", rows)
    (tmp_path / "l.csv").write_text("text,label,split\na b,x,train\nc d,y,train\ne f,x,test\n")
    (tmp_path / "l.jsonl").write_text("".join(json.dumps({"text": t, "label": l, "split": s}) + "\n"
                                              for t, l, s in zip(*rows.values())))
    for name in ("l.parquet", "l.csv", "l.jsonl"):
        assert detect_format(tmp_path / name) == "labels"
        ds = load_dataset(tmp_path / name)
        assert ds.kind == "labels" and ds.frame["label"].to_list() == ["x", "y", "x"]
        assert ds.frame["label_path"].to_list() == [["x"], ["y"], ["x"]]
        assert ds.texts() == ["a b", "c d", "e f"]


def test_text_column_and_integer_labels(tmp_path):
    path = _write(tmp_path / "l.parquet", {"text": ["HEADER x", "HEADER y"], "body": ["one", "two"], "cls": [3, 7]})
    ds = load_dataset(path, "labels?text_column=body&label_column=cls")
    assert ds.texts() == ["one", "two"] and ds.frame["label"].to_list() == ["3", "7"]
    assert ds.frame["split"].to_list() == ["train", "train"]  # no split column: all train


def test_hierarchy_from_separator_and_from_columns(tmp_path):
    path = _write(tmp_path / "l.parquet", {"text": ["a", "b", "c"], "label": ["comp.sys.mac", "comp.graphics", "rec.autos"],
                                           "top": ["comp", "comp", "rec"]})
    ds = load_dataset(path, "labels?label_sep=.")
    assert ds.frame["label"].to_list() == ["comp.sys.mac", "comp.graphics", "rec.autos"]
    assert ds.frame["label_path"].to_list() == [["comp", "sys", "mac"], ["comp", "graphics"], ["rec", "autos"]]
    ds = load_dataset(path, "labels?label_columns=top,label")
    assert ds.frame["label_path"].to_list() == [["comp", "comp.sys.mac"], ["comp", "comp.graphics"], ["rec", "rec.autos"]]
    assert ds.spec.label_columns == ("top", "label")


def test_format_string_round_trip_and_cli_folding():
    spec = LabelSpec(text_column="body", label_sep=":")
    assert LabelSpec.from_format(spec.to_format()) == spec
    assert LabelSpec().to_format() == "labels"
    fmt = label_format(None, text_column="body", label_columns="level1, level2,label")
    assert LabelSpec.from_format(fmt) == LabelSpec(text_column="body", label_columns=("level1", "level2", "label"))
    assert label_format("sts") == "sts"  # no label option: unchanged
    with pytest.raises(ValueError, match="applies to --format labels"):
        label_format("sts", text_column="body")
    with pytest.raises(ValueError, match="unknown option"):
        LabelSpec.from_format("labels?colour=red")
    with pytest.raises(ValueError, match="not both"):
        LabelSpec(label_sep=".", label_columns=("a", "b"))


def test_missing_label_is_an_error_naming_the_row(tmp_path):
    path = _write(tmp_path / "l.parquet", {"text": ["a", "b", "c"], "label": ["x", None, ""]})
    with pytest.raises(DataError, match=r"row 1: label 'label' is missing \(2 rows"):
        load_dataset(path, "labels")
    (tmp_path / "l.csv").write_text("text,label\na,x\nb,\n")
    with pytest.raises(DataError, match=r"l.csv:3: label 'label' is missing"):
        load_dataset(tmp_path / "l.csv", "labels")


def test_missing_columns_and_bad_levels(tmp_path):
    path = _write(tmp_path / "l.parquet", {"body": ["a", "b"], "label": ["x.y", "x..z"]})
    with pytest.raises(DataError, match="missing column.*text.*--text-column"):
        load_dataset(path, "labels")
    with pytest.raises(DataError, match=r"row 1: label 'x..z' has an empty level"):
        load_dataset(path, "labels?text_column=body&label_sep=.")
    path = _write(tmp_path / "m.parquet", {"text": ["a", "b"], "top": ["p", "q"], "label": ["leaf", "leaf"]})
    with pytest.raises(DataError, match=r"row 1: label 'leaf' has the levels q > leaf here but p > leaf at row 0"):
        load_dataset(path, "labels?label_columns=top,label")


def test_single_class_is_an_error(tmp_path):
    path = _write(tmp_path / "l.parquet", {"text": ["a", "b"], "label": ["x", "x"]})
    with pytest.raises(DataError, match="single class"):
        load_dataset(path)


def test_empty_texts_are_skipped_and_counted(tmp_path, caplog):
    path = _write(tmp_path / "l.parquet", {"text": ["a", "  ", "c", ""], "label": ["x", "y", "y", "x"]})
    with caplog.at_level(logging.WARNING):
        frame, skipped = read_labels_counted(path)
    assert skipped == 2 and frame["text"].to_list() == ["a", "c"]
    assert "skipped 2 empty 'text' value(s) (row 1, row 3)" in caplog.text
    assert load_dataset(path).skipped == 2


def test_label_only_in_test_is_counted_and_reported(tmp_path, caplog):
    path = _write(tmp_path / "l.parquet", {"text": list("abcdef"), "label": ["x", "y", "x", "z", "z", "w"],
                                           "split": ["train", "train", "test", "test", "test", "dev"]})
    with caplog.at_level(logging.WARNING):
        frame, _ = read_labels_counted(path)
    assert unseen_labels(frame) == {"dev": {"w": 1}, "test": {"z": 2}}
    assert "2 test text(s) carry 1 label(s) absent from train: z" in caplog.text


@pytest.mark.slow
def test_real_20newsgroups(real_dataset):
    path = real_dataset("20newsgroups")
    assert detect_format(path) == "labels"
    ds = load_dataset(path, "labels?text_column=body&label_columns=level1,level2,label")
    assert ds.skipped == 34 and ds.frame.height == 18846 - 34
    assert ds.frame["label"].n_unique() == 20
    assert ds.frame.filter(pl.col("label") == "comp.sys.mac.hardware")["label_path"][0].to_list() == \
        ["comp", "comp.sys", "comp.sys.mac.hardware"]
    assert not ds.texts()[0].startswith("From:")  # the body, without the headers that name the group
