"""--unlabeled files: every format read as the documents they are, bad input one line naming file and line."""
import json

import polars as pl
import pytest

from headstore.data.errors import DataError
from headstore.data.text_id import doc_text
from headstore.data.unlabeled import read_unlabeled


def test_each_format_reads_its_texts_as_documents(tmp_path):
    (tmp_path / "a.txt").write_text("first text\n\n  second text  \nfirst text\n")
    beir = tmp_path / "beir"
    beir.mkdir()
    lines = [{"_id": "1", "title": "A title", "text": "its body."}, {"_id": "2", "title": "", "text": " no title "},
             {"_id": "3", "title": "", "text": "   "}]
    (beir / "corpus.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    pl.DataFrame({"body": ["p one", "p two", " "]}).write_parquet(tmp_path / "c.parquet")
    pl.DataFrame({"title": ["T", None], "text": ["x", "y"]}).write_parquet(tmp_path / "d.parquet")
    got = read_unlabeled([tmp_path / "a.txt", beir, beir / "corpus.jsonl", tmp_path / "c.parquet",
                          tmp_path / "d.parquet"])
    want = ["first text", "second text", doc_text("A title", "its body."), "no title", "p one", "p two", "T x", "y"]
    assert got.texts == want
    assert got.skipped_empty == 3  # the blank BEIR document (read twice) and the blank Parquet value; blank .txt
    # lines separate texts, they are no items
    assert got.duplicates == 1 + 2  # "first text" again, and the BEIR folder's two texts read again as its file
    assert got.places[1] == (str(tmp_path / "a.txt"), 3, None)  # where each text was first seen
    assert got.places[4] == (str(tmp_path / "c.parquet"), None, 0)


@pytest.mark.parametrize("name, body, needle", [
    ("empty.txt", b"", "empty.txt: empty file (0 bytes): no unlabeled texts"),
    ("blank.txt", b"\n  \n", "blank.txt: no unlabeled texts: every item is empty or blank"),
    ("latin.txt", b"fine\nalso fine\ncaf\xe9\n", "latin.txt:3: not valid UTF-8"),
    ("notext.jsonl", b'{"text": "a"}\n{"body": "b"}\n', 'notext.jsonl:2: no "text"'),
    ("number.jsonl", b'{"text": 3}\n', 'number.jsonl:1: "text" must be a string'),
    ("broken.jsonl", b'{"text": "a"}\n{"text": \n', "broken.jsonl:2: invalid JSON"),
])
def test_bad_files_are_one_error_naming_file_and_line(tmp_path, name, body, needle):
    (tmp_path / name).write_bytes(body)
    with pytest.raises(DataError) as err:
        read_unlabeled([tmp_path / name])
    assert str(err.value).startswith(str(tmp_path / needle)), str(err.value)


def test_parquet_null_and_unknown_files_are_refused(tmp_path):
    pl.DataFrame({"text": ["a", None]}).write_parquet(tmp_path / "n.parquet")
    with pytest.raises(DataError, match=r"n.parquet: row 1: text is missing \(null\)"):
        read_unlabeled([tmp_path / "n.parquet"])
    pl.DataFrame({"a": ["x"], "b": ["y"]}).write_parquet(tmp_path / "two.parquet")
    with pytest.raises(DataError, match="no 'text' column and not exactly one text column"):
        read_unlabeled([tmp_path / "two.parquet"])
    with pytest.raises(FileNotFoundError, match="check the --unlabeled path"):
        read_unlabeled([tmp_path / "absent.txt"])
    (tmp_path / "x.bin").write_bytes(b"abc")
    with pytest.raises(ValueError, match="an --unlabeled file is"):
        read_unlabeled([tmp_path / "x.bin"])
