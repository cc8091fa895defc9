"""Readers for the four dataset formats, each returning validated polars frames.

- BEIR folder (IR): ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``  -> ``read_beir`` (data.beir)
- STS pairs with a similarity score (Parquet/TSV/CSV)                          -> ``read_sts``
- training pairs ``anchor``/``positive``[/``negative``][/``label``] (Parquet/CSV/JSONL) -> ``read_pairs``
- plain passages (.txt, one per line, or a Parquet text column)                -> ``read_text``

Bad input raises ``DataError`` naming the file, the line (text files, 1-based, header counted) or
row (Parquet, 0-based) and the problem. Nothing is dropped silently: the only things skipped are
blank lines of text/JSONL files and, in ``read_text``, empty passages (counted and logged).
Every case and what happens is listed in docs/bad-input.md.
"""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from headstore.data.beir import BeirData, read_beir  # noqa: F401  (data.readers offers every format's reader)
from headstore.data.errors import DataError
from headstore.data.hf import is_hf_dataset_dir
from headstore.data.tables import (Table, check_float_column, check_split_column, check_text_column, parquet_schema,
                                   read_lines, read_table, require_columns)

log = logging.getLogger(__name__)

# ---- STS ----------------------------------------------------------------------------------------

# Score scales recognised without --score-range, tried in this order: the STS benchmarks' 0-5 gold, and
# 0-1 (similarities, normalised gold). Any other range must be declared.
KNOWN_SCORE_RANGES = ((0.0, 1.0), (0.0, 5.0))
DETECT = "detect"


def _fmt_range(lo: float, hi: float) -> str:
    return f"{lo:g},{hi:g}"


def check_score_range(table: Table, scores: pl.Series, score_range) -> tuple[float, float]:
    """The range the scores are on: ``score_range`` (LO, HI) checked row by row, or detected.

    Detection takes the first of ``KNOWN_SCORE_RANGES`` that holds every score; scores outside both
    are an error asking for ``--score-range``. A score outside a declared range names its row."""
    if score_range == DETECT:
        lo, hi = float(scores.min()), float(scores.max())
        for known in KNOWN_SCORE_RANGES:
            if known[0] <= lo and hi <= known[1]:
                return known
        at_lo, at_hi = table.place(int(scores.arg_min())), table.place(int(scores.arg_max()))
        raise table.whole_file_error(
            f"scores run from {lo:g} ({at_lo}) to {hi:g} ({at_hi}), which is neither "
            f"0-1 nor 0-5 (give the scale with --score-range LO,HI, e.g. --score-range {_fmt_range(lo, hi)})")
    lo, hi = (float(v) for v in score_range)
    if not lo < hi:
        raise ValueError(f"--score-range {_fmt_range(lo, hi)}: LO must be below HI")
    outside = (scores < lo) | (scores > hi)
    bad = outside.arg_true()
    if len(bad):
        first = int(bad[0])
        more = f" ({len(bad)} rows are outside; the first is shown)" if len(bad) > 1 else ""
        raise table.error(first, f"score {scores[first]:g} is outside the declared range "
                          f"{_fmt_range(lo, hi)}{more} (fix the row or give the right --score-range)")
    return lo, hi


def read_sts_ranged(path: str | Path, score_range=None) -> tuple[pl.DataFrame, tuple[float, float] | None]:
    """``read_sts`` plus the score range: None leaves the scores unchecked (texts only, e.g. featurize),
    ``"detect"`` detects 0-1 / 0-5, (LO, HI) declares it (every score must lie in it)."""
    table = read_table(path)
    require_columns(table, ["sentence1", "sentence2", "score"])
    columns = {
        "sentence1": check_text_column(table, "sentence1"),
        "sentence2": check_text_column(table, "sentence2"),
        "score": check_float_column(table, "score"),
        "split": check_split_column(table),
    }
    found = None if score_range is None else check_score_range(table, columns["score"], score_range)
    return _with_columns_first(table.frame, columns), found


def read_sts(path: str | Path, score_range=None) -> pl.DataFrame:
    """Sentence pairs with a similarity score: ``sentence1``, ``sentence2``, ``score`` (finite f64),
    ``split`` — plus any other columns of the file, kept as they are.

    A file without a ``split`` column is all ``"train"``; split names become train / dev / test
    (``validation``/``valid``/``val`` are dev, any case) and any other name is an error.
    ``score_range``: see ``read_sts_ranged``.
    """
    return read_sts_ranged(path, score_range)[0]


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
            raise table.error(first, f"label must be 0 or 1 (or a float in [0, 1]), got {series[first]}")
        return labels.cast(pl.Float64)
    labels = check_float_column(table, "label")
    bad = ((labels < 0) | (labels > 1)).arg_true()
    if len(bad):
        first = int(bad[0])
        raise table.error(first, f"label {labels[first]:g} is outside [0, 1] (labels are 1 for a positive "
                          "pair, 0 for a negative, or a graded score in between; rescale the column)")
    return labels


def read_pairs(path: str | Path) -> pl.DataFrame:
    """Training pairs: ``anchor``, ``positive``, optional ``negative``, ``label`` (f64), ``split``.

    - ``anchor``/``positive`` may be named ``sentence1``/``sentence2``, ``question``/``sentence`` or
      ``query``/``answer`` (see ``PAIR_NAMES``); they are renamed.
    - ``label``: 0/1 integers or floats in [0, 1]. A file without labels is all positives (label 1.0).
    - A file without a ``split`` column is all ``"train"``; split names as in ``read_sts``.
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
    """The text columns of a Parquet file, or of a `datasets.save_to_disk` folder."""
    schema = read_table(path).frame.schema if is_hf_dataset_dir(path) else parquet_schema(path)
    return [n for n, t in schema.items() if t in (pl.String, pl.Utf8)]


NUL_PROBLEM = "contains a NUL character (\\x00) (remove it)"  # refused, never stripped


def passage_of_line(path: Path, number: int, line: str) -> str:
    """A line of a plain-text corpus as its passage (stripped; '' for a blank line). A NUL character
    is refused naming the line, as in every other format (read_text and featurize's stream alike)."""
    if "\x00" in line:
        raise DataError(path, NUL_PROBLEM, line=number)
    return line.strip()


def check_passage_values(path: Path, column: str, values: list, first_row: int = 0) -> None:
    """Values of a Parquet text column read in chunks (row `first_row` on): a null or a NUL
    character is refused naming its row, as read_text refuses them."""
    for i, value in enumerate(values):
        if value is None:
            raise DataError(path, f"{column} is missing (null)", row=first_row + i)
        if "\x00" in value:
            raise DataError(path, f"{column} {NUL_PROBLEM}", row=first_row + i)


def read_text_counted(path: str | Path, column: str = "text") -> tuple[pl.DataFrame, int]:
    """``read_text`` plus the number of empty passages skipped."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in TEXT_FILE_SUFFIXES:
        if not path.is_file():
            raise DataError(path, "no such file")
        kept = []
        for number, line in read_lines(path):
            passage = passage_of_line(path, number, line)
            if passage:
                kept.append(passage)
        if not kept:
            raise DataError(path, "no passages: the file is empty or blank")
        # blank lines separate passages in plain-text files; they are not passages themselves
        frame = pl.DataFrame({"text": pl.Series(kept, dtype=pl.String),
                              "split": pl.Series(["train"] * len(kept), dtype=pl.String)})
        return frame, 0
    if suffix != ".parquet" and not is_hf_dataset_dir(path):
        raise ValueError(f"{path}: read_text reads {', '.join(TEXT_FILE_SUFFIXES)}, .parquet or a datasets "
                         f"folder, not {suffix!r}")
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
    nul = series.str.contains("\x00", literal=True).arg_true()
    if len(nul):
        raise table.error(int(nul[0]), f"{column} {NUL_PROBLEM}")
    empty = series.str.strip_chars().str.len_chars() == 0
    skipped = int(empty.sum())
    if skipped:
        rows = empty.arg_true().head(5).to_list()
        log.warning("%s: skipped %d empty %r value(s) (rows %s%s)", path, skipped, column,
                    ", ".join(map(str, rows)), ", ..." if skipped > 5 else "")
    # keep the other columns (labels, split, ids); a different column called "text" gives way
    if skipped == len(series):
        raise table.whole_file_error(f"no passages: every {column!r} value is empty")
    rest = table.frame.drop([c for c in {column, "text"} if c in table.frame.columns])
    # split names of unlabeled text are kept as written (wikitext's `validation` is not a dev set)
    columns = {"text": series, "split": check_split_column(table, canonical=False)}
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
