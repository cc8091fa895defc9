"""Unlabeled texts (`--unlabeled PATH`): the large corpus beside a few pairs, read as the documents they are.

One text per item, from any of:
- a plain-text file (`.txt`, `.text`): one text per line, stripped; blank lines separate texts (not counted);
- JSONL: one object per line with `text` (and optionally `title`): a BEIR `corpus.jsonl` reads as its
  documents, `title + " " + text` as featurize and the BEIR reader make them (data.text_id.doc_text);
- a table (Parquet, CSV, TSV, a `datasets.save_to_disk` folder): its `text` column (or its only text column),
  values as they are (as the `text` format reads them), `title + " " + text` where it has a `title` column;
- a BEIR folder: its `corpus.jsonl`.

Bad input is one DataError naming the file and the line (or Parquet row): an empty file, text that is not
UTF-8, a line that is not a JSON object or has no text, a null. An item whose text is empty is skipped and
counted; a text given twice (in one file or across files) is one text, counted as a duplicate. Where each text
was first seen is kept, so a later problem with a text (not in the store) can name its line.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import polars as pl

from headstore.data.dataset import resolve_data_path
from headstore.data.errors import DataError
from headstore.data.hf import is_hf_dataset_dir
from headstore.data.readers import TEXT_FILE_SUFFIXES, passage_of_line
from headstore.data.tables import TABLE_SUFFIXES, read_jsonl_objects, read_lines, read_table
from headstore.data.text_id import doc_text

UNLABELED = "unlabeled"  # the format featurize reads an --unlabeled file under (data paths beside --data)
READS = "a .txt (one text per line), JSONL ({\"text\": ...} per line; a BEIR corpus.jsonl), Parquet/CSV/TSV " \
        "(a text column) or a BEIR folder"


@dataclass(frozen=True)
class UnlabeledTexts:
    """The unique texts of one or more --unlabeled files, in order of first sight, and where each was seen."""

    paths: tuple[str, ...]
    texts: list[str]
    places: list[tuple[str, int | None, int | None]]  # (file, line, row) of each text's first sight
    skipped_empty: int = 0  # items whose text is empty (whitespace only)
    duplicates: int = 0  # items repeating a text seen before (in any of the files)

    def error(self, index: int, problem: str) -> DataError:
        """A DataError at where text `index` was first seen: `path:line: problem` (Parquet: `path: row R:`)."""
        path, line, row = self.places[index]
        return DataError(path, problem, line=line, row=row)


def _text_file(path: Path) -> Iterator[tuple[str, int | None, int | None]]:
    for number, line in read_lines(path):  # not UTF-8: an error naming the line
        if number == 1:
            line = line.removeprefix("\ufeff")
        text = passage_of_line(path, number, line)
        if text:  # blank lines separate texts: not items, not counted
            yield text, number, None


def _string(path: Path, line: int, obj: dict, key: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataError(path, f'"{key}" must be a string, got {type(value).__name__}', line=line)
    if "\x00" in value:
        raise DataError(path, f'"{key}" contains a NUL character (\\u0000) (remove it)', line=line)
    return value


def _jsonl_file(path: Path) -> Iterator[tuple[str, int | None, int | None]]:
    for line, obj in read_jsonl_objects(path):
        if "text" not in obj:
            raise DataError(path, 'no "text" (each line of an --unlabeled JSONL file is {"text": ...}, '
                            'a BEIR corpus line {"_id", "title", "text"})', line=line)
        yield doc_text(_string(path, line, obj, "title"), _string(path, line, obj, "text")), line, None


def _table_file(path: Path) -> Iterator[tuple[str, int | None, int | None]]:
    table = read_table(path)
    frame = table.frame
    strings = [n for n, t in frame.schema.items() if t == pl.String and n != "title"]
    column = "text" if "text" in frame.columns else (strings[0] if len(strings) == 1 else None)
    if column is None:
        raise table.whole_file_error(f"no 'text' column and not exactly one text column (text columns: "
                                     f"{', '.join(strings) or 'none'}) (name the column of the texts 'text')")
    for name in (column, "title"):
        if name in frame.columns and frame[name].dtype not in (pl.String, pl.Null):
            raise table.whole_file_error(f"column {name!r} must be text, but holds {frame[name].dtype}")
    texts = frame[column].to_list()
    titles = frame["title"].to_list() if "title" in frame.columns else None
    for i, text in enumerate(texts):
        if text is None:
            raise table.error(i, f"{column} is missing (null) (give every row a text, or drop the row)")
        if "\x00" in text or (titles and titles[i] and "\x00" in titles[i]):
            raise table.error(i, f"{column} contains a NUL character (\\x00) (remove it)")
        value = doc_text(titles[i] or "", text) if titles is not None else text
        line = None if table.lines is None else table.lines[i]
        yield value, line, (i if table.lines is None else None)


def _items(path: Path) -> Iterator[tuple[str, int | None, int | None]]:
    """(text, line, row) of every item of one --unlabeled file or folder."""
    if path.is_dir() and (path / "corpus.jsonl").is_file():  # a BEIR folder: its corpus
        path = path / "corpus.jsonl"
    if path.is_dir() and not is_hf_dataset_dir(path):
        path = resolve_data_path(path)
    if path.is_file() and path.stat().st_size == 0:
        raise DataError(path, f"empty file (0 bytes): no unlabeled texts (give {READS})")
    suffix = path.suffix.lower()
    if suffix in TEXT_FILE_SUFFIXES:
        return _text_file(path)
    if suffix == ".jsonl":
        return _jsonl_file(path)
    if suffix in TABLE_SUFFIXES or is_hf_dataset_dir(path):
        return _table_file(path)
    raise ValueError(f"{path}: an --unlabeled file is {READS}; not {suffix or 'a folder without corpus.jsonl'!r}")


def read_unlabeled(paths: Iterable[str | Path]) -> UnlabeledTexts:
    """The unique non-empty texts of every file in `paths` (each path: see the module's formats); a file with
    no text at all is an error naming it."""
    texts, places, seen = [], [], set()
    skipped = duplicates = 0
    names = tuple(str(p) for p in paths)
    for name in names:
        path, found = Path(name), 0
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or folder (check the --unlabeled path)")
        for text, line, row in _items(path):
            if not text.strip():
                skipped += 1
                continue
            found += 1
            if text in seen:
                duplicates += 1
                continue
            seen.add(text)
            texts.append(text)
            places.append((str(path), line, row))
        if not found:
            raise DataError(path, f"no unlabeled texts: every item is empty or blank (give {READS})")
    return UnlabeledTexts(names, texts, places, skipped, duplicates)
