"""Readers for the four dataset formats, each returning validated polars frames.

- BEIR folder (IR): ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``  -> ``read_beir``
- STS pairs with a similarity score (Parquet/TSV/CSV)                          -> ``read_sts``
- training pairs ``anchor``/``positive``[/``negative``][/``label``] (Parquet/CSV/JSONL) -> ``read_pairs``
- plain passages (.txt, one per line, or a Parquet text column)                -> ``read_text``

Bad input raises ``DataError`` naming the file, the line (text files, 1-based, header counted) or
row (Parquet, 0-based) and the problem. Nothing is dropped silently: the only things skipped are
blank lines of text/JSONL files and, in ``read_text``, empty passages (counted and logged).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from headstore.data.errors import DataError
from headstore.data.tables import (Table, check_float_column, check_split_column, check_text_column,
                         read_jsonl_objects, read_lines, read_table, require_columns)

log = logging.getLogger(__name__)

QRELS_HEADER = ("query-id", "corpus-id", "score")


# ---- BEIR ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BeirData:
    corpus: pl.DataFrame  # _id, title, text (all String)
    queries: pl.DataFrame  # _id, text
    qrels: dict[str, pl.DataFrame]  # split -> query_id, corpus_id, score (Int64)
    path: Path = field(default=Path("."))


def _string_id(path: Path, line: int, obj: dict) -> str:
    if "_id" not in obj:
        raise DataError(path, 'missing "_id"', line=line)
    value = obj["_id"]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataError(path, f'"_id" must be a string or integer, got {value!r}', line=line)
    value = str(value)  # ids are strings: qrels refer to them as text
    if not value.strip():
        raise DataError(path, '"_id" is empty', line=line)
    return value


def _string_field(path: Path, line: int, obj: dict, key: str, required: bool) -> str:
    if key not in obj or obj[key] is None:
        if required:
            raise DataError(path, f'missing "{key}"', line=line)
        return ""
    value = obj[key]
    if not isinstance(value, str):
        raise DataError(path, f'"{key}" must be a string, got {type(value).__name__}', line=line)
    return value


def _read_beir_jsonl(path: Path, with_title: bool) -> tuple[pl.DataFrame, dict[str, int]]:
    if not path.is_file():
        raise DataError(path, "no such file (a BEIR folder needs corpus.jsonl and queries.jsonl)")
    ids: list[str] = []
    titles: list[str] = []
    texts: list[str] = []
    line_of: dict[str, int] = {}
    empty_docs: list[int] = []
    for line, obj in read_jsonl_objects(path):
        _id = _string_id(path, line, obj)
        if _id in line_of:
            raise DataError(path, f'duplicate "_id" {_id!r} (first at line {line_of[_id]})', line=line)
        line_of[_id] = line
        text = _string_field(path, line, obj, "text", required=True)
        title = _string_field(path, line, obj, "title", required=False) if with_title else ""
        if not (title + text).strip():
            if not with_title:  # a query with no text cannot be asked
                raise DataError(path, f"query {_id!r} has empty text", line=line)
            empty_docs.append(line)
        ids.append(_id)
        titles.append(title)
        texts.append(text)
    if empty_docs:  # kept: qrels may judge them (Cranfield 471, 995), and they encode as ""
        log.warning("%s: %d document(s) with empty title and text (line %s%s)", path,
                    len(empty_docs), ", ".join(map(str, empty_docs[:5])),
                    ", ..." if len(empty_docs) > 5 else "")
    columns = {"_id": ids, "title": titles, "text": texts} if with_title else {"_id": ids, "text": texts}
    frame = pl.DataFrame({k: pl.Series(k, v, dtype=pl.String) for k, v in columns.items()})
    return frame, line_of


def _read_qrels(path: Path, query_ids: dict, corpus_ids: dict) -> pl.DataFrame:
    query_col: list[str] = []
    corpus_col: list[str] = []
    scores: list[int] = []
    seen: dict[tuple[str, str], int] = {}
    lines = read_lines(path)
    header = next(lines, (1, ""))[1]
    if tuple(header.split("\t")) != QRELS_HEADER:
        raise DataError(path, f"expected the header {chr(9).join(QRELS_HEADER)!r} (tab separated), "
                        f"got {header!r}", line=1)
    for line, row in lines:
        if not row.strip():
            continue
        fields = row.split("\t")
        if len(fields) != 3:
            raise DataError(path, f"expected 3 tab-separated fields (query-id, corpus-id, score), "
                            f"got {len(fields)}: {row!r}", line=line)
        qid, did, score = (f.strip() for f in fields)
        try:
            score_int = int(score)
        except ValueError:
            raise DataError(path, f"score must be an integer, got {score!r}", line=line) from None
        if qid not in query_ids:
            raise DataError(path, f"query id {qid!r} is not in queries.jsonl", line=line)
        if did not in corpus_ids:
            raise DataError(path, f"corpus id {did!r} is not in corpus.jsonl", line=line)
        if (qid, did) in seen:
            raise DataError(path, f"duplicate judgement for query {qid!r}, document {did!r} "
                            f"(first at line {seen[qid, did]})", line=line)
        seen[qid, did] = line
        query_col.append(qid)
        corpus_col.append(did)
        scores.append(score_int)
    return pl.DataFrame({"query_id": pl.Series(query_col, dtype=pl.String),
                         "corpus_id": pl.Series(corpus_col, dtype=pl.String),
                         "score": pl.Series(scores, dtype=pl.Int64)})


def read_beir(folder: str | Path) -> BeirData:
    """Read a BEIR-layout folder. Ids become strings; a missing title reads as ""."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(folder, "not a folder (a BEIR dataset is a folder holding corpus.jsonl)")
    corpus, corpus_ids = _read_beir_jsonl(folder / "corpus.jsonl", with_title=True)
    queries, query_ids = _read_beir_jsonl(folder / "queries.jsonl", with_title=False)
    qrels_files = sorted((folder / "qrels").glob("*.tsv"))
    if not qrels_files:
        log.warning("%s: no qrels/<split>.tsv files; the dataset has no relevance judgements", folder)
    qrels = {p.stem: _read_qrels(p, query_ids, corpus_ids) for p in qrels_files}
    return BeirData(corpus=corpus, queries=queries, qrels=qrels, path=folder)


# ---- STS ----------------------------------------------------------------------------------------

def read_sts(path: str | Path) -> pl.DataFrame:
    """Sentence pairs with a similarity score: ``sentence1``, ``sentence2``, ``score`` (finite f64),
    ``split`` — plus any other columns of the file, kept as they are.

    A file without a ``split`` column is all ``"train"``.
    """
    table = read_table(path)
    require_columns(table, ["sentence1", "sentence2", "score"])
    columns = {
        "sentence1": check_text_column(table, "sentence1"),
        "sentence2": check_text_column(table, "sentence2"),
        "score": check_float_column(table, "score"),
        "split": check_split_column(table),
    }
    return _with_columns_first(table.frame, columns)


# ---- pairs --------------------------------------------------------------------------------------

# The (anchor, positive) column names accepted, in order of preference: the canonical names, then
# the names common pair files use (MRPC: sentence1/sentence2; answer selection: question/sentence).
PAIR_NAMES = (("anchor", "positive"), ("sentence1", "sentence2"), ("question", "sentence"),
              ("query", "answer"))


def pair_columns(columns: list[str]) -> tuple[str, str] | None:
    """The file's (anchor, positive) column names; None if it has none of ``PAIR_NAMES``."""
    return next(((a, p) for a, p in PAIR_NAMES if a in columns and p in columns), None)


def _check_label_column(table: Table) -> pl.Series:
    series = table.frame["label"]
    if series.dtype.is_integer() or series.dtype == pl.Boolean:
        labels = series.cast(pl.Int64)
        bad = series.is_null() | ~labels.is_in([0, 1])
        if bad.any():
            first = int(bad.arg_true()[0])
            raise table.error(first, f"label must be 0 or 1 (or a float), got {series[first]}")
        return labels.cast(pl.Float64)
    return check_float_column(table, "label")


def read_pairs(path: str | Path) -> pl.DataFrame:
    """Training pairs: ``anchor``, ``positive``, optional ``negative``, ``label`` (f64), ``split``.

    - ``anchor``/``positive`` may be named ``sentence1``/``sentence2``, ``question``/``sentence`` or
      ``query``/``answer`` (see ``PAIR_NAMES``); they are renamed.
    - ``label``: 0/1 integers or finite floats. A file without labels is all positives (label 1.0).
    - A file without a ``split`` column is all ``"train"``.
    Other columns are kept as they are.
    """
    table = read_table(path)
    names = pair_columns(table.frame.columns)
    if names is None:
        raise table.whole_file_error(
            "missing columns anchor, positive (or one of "
            f"{', '.join('/'.join(p) for p in PAIR_NAMES[1:])}); the file has {', '.join(table.frame.columns) or 'no columns'}")
    anchor, positive = names
    columns = {"anchor": check_text_column(table, anchor),
               "positive": check_text_column(table, positive)}
    if "negative" in table.frame.columns:
        columns["negative"] = check_text_column(table, "negative")
    if "label" in table.frame.columns:
        columns["label"] = _check_label_column(table)
    else:
        columns["label"] = pl.Series("label", [1.0] * table.frame.height, dtype=pl.Float64)
    columns["split"] = check_split_column(table)
    rest = table.frame.drop([anchor, positive])
    return _with_columns_first(rest, columns)


# ---- plain text ---------------------------------------------------------------------------------

TEXT_FILE_SUFFIXES = (".txt", ".text")


def string_columns(path: Path) -> list[str]:
    return [n for n, t in pl.read_parquet_schema(path).items() if t in (pl.String, pl.Utf8)]


def read_text_counted(path: str | Path, column: str = "text") -> tuple[pl.DataFrame, int]:
    """``read_text`` plus the number of empty passages skipped."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in TEXT_FILE_SUFFIXES:
        if not path.is_file():
            raise DataError(path, "no such file")
        texts = [line.strip() for _, line in read_lines(path)]
        kept = [t for t in texts if t]
        # blank lines separate passages in plain-text files; they are not passages themselves
        frame = pl.DataFrame({"text": pl.Series(kept, dtype=pl.String),
                              "split": pl.Series(["train"] * len(kept), dtype=pl.String)})
        return frame, 0
    if suffix != ".parquet":
        raise ValueError(f"{path}: read_text reads {', '.join(TEXT_FILE_SUFFIXES)} or .parquet, "
                         f"not {suffix!r}")
    table = read_table(path)
    if column not in table.frame.columns:
        strings = string_columns(path)
        if column == "text" and len(strings) == 1:
            log.info("%s: no 'text' column; using its only text column %r", path, strings[0])
            column = strings[0]
        else:
            raise table.whole_file_error(
                f"no column {column!r}; its text columns are {', '.join(strings) or 'none'} "
                "(choose one with column=...)")
    series = table.frame[column]
    if series.dtype != pl.String:
        raise table.whole_file_error(f"column {column!r} must be text, but holds {series.dtype}")
    nulls = series.is_null().arg_true()
    if len(nulls):
        raise table.error(int(nulls[0]), f"{column} is missing (null)"
                          + (f" ({len(nulls)} rows)" if len(nulls) > 1 else ""))
    empty = series.str.strip_chars().str.len_chars() == 0
    skipped = int(empty.sum())
    if skipped:
        rows = empty.arg_true().head(5).to_list()
        log.warning("%s: skipped %d empty %r value(s) (rows %s%s)", path, skipped, column,
                    ", ".join(map(str, rows)), ", ..." if skipped > 5 else "")
    # keep the other columns (labels, split, ids); a different column called "text" gives way
    rest = table.frame.drop([c for c in {column, "text"} if c in table.frame.columns])
    columns = {"text": series, "split": check_split_column(table)}
    frame = _with_columns_first(rest, columns).filter(~empty)
    return frame, skipped


def read_text(path: str | Path, column: str = "text") -> pl.DataFrame:
    """Passages as a ``text`` column (plus ``split``, ``"train"`` when the file has none).

    - ``.txt``/``.text``: one passage per line, stripped; blank lines are skipped by design (they
      separate passages, as in WikiText).
    - ``.parquet``: the ``column`` column (default ``text``; a file with a single text column is read
      from it whatever its name). A null is an error naming its row; empty strings are skipped and
      the count is logged as a warning (``read_text_counted`` returns it). Other columns are kept.
    """
    return read_text_counted(path, column)[0]


def _with_columns_first(frame: pl.DataFrame, columns: dict[str, pl.Series]) -> pl.DataFrame:
    """``columns`` (validated, in this order) followed by the frame's other columns."""
    rest = frame.drop([c for c in columns if c in frame.columns])
    first = pl.DataFrame([s.alias(name) for name, s in columns.items()])
    return pl.concat([first, rest], how="horizontal")
