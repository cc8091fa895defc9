"""Tabular files (Parquet, CSV, TSV, JSONL) into polars frames that remember where each row came from.

The readers in ``readers.py`` validate columns; when a value is bad they need to say *where* it is.
A ``Table`` pairs the frame with that position: 0-based row numbers for Parquet, 1-based line numbers
(header line counted) for text files. CSV/TSV/JSONL are parsed with the standard library so the line
numbers are exact (a quoted CSV field may span lines; ``csv`` tracks that) and a ragged row is reported
at its own line instead of as a parser failure somewhere in the file.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import polars as pl

from headstore.data.hf import hf_columns, is_hf_dataset_dir, read_hf_frame

from headstore.data.errors import DataError

TABLE_SUFFIXES = (".parquet", ".csv", ".tsv", ".jsonl")


@dataclass(frozen=True)
class Table:
    frame: pl.DataFrame
    path: Path
    lines: list[int] | None  # line of each row in a text file; None for Parquet (rows are the place)

    def error(self, index: int, problem: str) -> DataError:
        """A DataError located at row ``index`` of the frame."""
        if self.lines is None:
            return DataError(self.path, problem, row=index)
        return DataError(self.path, problem, line=self.lines[index])

    def place(self, index: int) -> str:
        """Where row ``index`` is, in words: ``line 12`` (text files) or ``row 11`` (Parquet)."""
        return f"row {index}" if self.lines is None else f"line {self.lines[index]}"

    def whole_file_error(self, problem: str) -> DataError:
        return DataError(self.path, problem)


# Split names: train on train, select on dev, report test. Common spellings of dev are accepted, in any case.
SPLIT_ALIASES = {"train": "train", "dev": "dev", "validation": "dev", "valid": "dev", "val": "dev",
                 "test": "test"}
SPLIT_HELP = "use train, dev (or validation/valid/val) or test, in any case"


def canonical_split(name: str) -> str | None:
    """``train``/``dev``/``test`` for a recognised split name (``Validation`` -> ``dev``), else None."""
    return SPLIT_ALIASES.get(name.strip().lower())


def read_utf8(path: Path) -> str:
    """The whole file as text; invalid UTF-8 is an error naming its line. A byte-order mark is dropped."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DataError(path, f"not valid UTF-8 ({e.reason} at byte {e.start}) "
                        "(re-save the file as UTF-8)", line=line) from None
    return text[1:] if text.startswith("\ufeff") else text  # a byte-order mark written by some editors


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its \\n or \\r\\n) for every line of a UTF-8 file."""
    text = read_utf8(path)
    # split on \n only: str.splitlines would also split on U+2028 etc., which JSON allows in strings
    for number, line in enumerate(text.split("\n"), start=1):
        yield number, line.removesuffix("\r")


def read_jsonl_objects(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line; a line that is not a JSON object is an error."""
    for number, line in read_lines(path):
        if not line.strip():
            continue  # blank lines (a trailing newline, spacing) hold no record
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(path, f"invalid JSON: {e.msg} (column {e.colno})", line=number) from None
        if not isinstance(obj, dict):
            raise DataError(path, f"expected a JSON object, got {type(obj).__name__}", line=number)
        yield number, obj


def _read_delimited(path: Path, delimiter: str) -> Table:
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL  # TSV quotes are text
    with io.StringIO(read_utf8(path), newline="") as f:
        try:
            reader = csv.reader(f, delimiter=delimiter, quoting=quoting, strict=True)
            header = next(reader, None)
            if header is None:
                raise DataError(path, "empty file: expected a header line")
            if len(set(header)) != len(header):
                raise DataError(path, f"duplicate column names in header {header}", line=1)
            columns: list[list[str]] = [[] for _ in header]
            lines: list[int] = []
            previous_end = reader.line_num
            for fields in reader:
                start = previous_end + 1
                previous_end = reader.line_num
                if not fields:  # csv gives [] for a blank line
                    continue
                if len(fields) != len(header):
                    raise DataError(path, f"expected {len(header)} fields ({', '.join(header)}), "
                                    f"got {len(fields)}", line=start)
                for column, value in zip(columns, fields):
                    column.append(value)
                lines.append(start)
        except csv.Error as e:
            raise DataError(path, f"CSV syntax error: {e}", line=reader.line_num) from None
    frame = pl.DataFrame({name: pl.Series(name, values, dtype=pl.String)
                          for name, values in zip(header, columns)})
    return Table(frame, path, lines)


def _read_jsonl_table(path: Path) -> Table:
    values: dict[str, list] = {}
    first_type: dict[str, tuple[type, int]] = {}
    lines: list[int] = []
    for number, obj in read_jsonl_objects(path):
        index = len(lines)
        for key, value in obj.items():
            if key not in values:
                values[key] = [None] * index  # a key that appears late is null in earlier rows
            if value is not None:
                kind = float if isinstance(value, int) and not isinstance(value, bool) else type(value)
                seen = first_type.setdefault(key, (kind, number))
                if seen[0] is not kind:  # int and float mix freely; anything else is a mistake
                    raise DataError(path, f'"{key}" is {type(value).__name__} here but '
                                    f"{seen[0].__name__} at line {seen[1]}", line=number)
            values[key].append(value)
        lines.append(number)
        for key, column in values.items():
            if len(column) == index:  # key missing from this object
                column.append(None)
    frame = pl.DataFrame({k: pl.Series(k, v, strict=False) for k, v in values.items()})
    return Table(frame, path, lines)


def _check_not_empty(path: Path) -> None:
    if not path.is_file():
        raise DataError(path, "no such file")
    if path.stat().st_size == 0:
        raise DataError(path, "empty file (0 bytes) (check that it was written completely)")


def parquet_schema(path: Path) -> dict:
    """Column name -> polars dtype of a Parquet file; a truncated or non-Parquet file is a DataError."""
    _check_not_empty(path)
    try:
        return dict(pl.read_parquet_schema(path))
    except Exception as e:  # pyarrow/polars raise many types for a corrupt file
        raise DataError(path, f"not a readable Parquet file ({type(e).__name__}: {_first_line(e)}) "
                        "(the file may be truncated or in another format; re-export it)") from None


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [""])[0][:200]


def read_table(path: str | Path) -> Table:
    """Read a Parquet, CSV, TSV or JSONL file; ValueError for any other suffix.

    An empty file, or one with a header and no rows, is a DataError: there is nothing to train or
    evaluate on."""
    path = Path(path)
    if is_hf_dataset_dir(path):  # a `datasets.save_to_disk` folder: rows are places, as in Parquet
        table = Table(read_hf_frame(path), path, None)
        if table.frame.height == 0:
            raise DataError(path, "no rows: nothing to read (check the dataset was saved fully)")
        return table
    suffix = path.suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise ValueError(f"{path}: unsupported file type {suffix!r}; valid: {', '.join(TABLE_SUFFIXES)}")
    _check_not_empty(path)
    if suffix == ".parquet":
        parquet_schema(path)
        try:
            table = Table(pl.read_parquet(path), path, None)
        except Exception as e:  # pyarrow/polars raise many types for a corrupt file
            raise DataError(path, f"cannot read Parquet ({type(e).__name__}: {_first_line(e)}) "
                            "(the file may be truncated; re-export it)") from None
    elif suffix == ".jsonl":
        table = _read_jsonl_table(path)
    else:
        table = _read_delimited(path, "," if suffix == ".csv" else "\t")
    if table.frame.height == 0:
        what = "no JSON objects" if suffix == ".jsonl" else "a header but no rows"
        raise DataError(path, f"{what}: nothing to read (add rows, or check the file was exported fully)")
    return table


def table_columns(path: str | Path) -> list[str]:
    """Column names of a table file without reading its body (for format detection)."""
    path = Path(path)
    if is_hf_dataset_dir(path):
        return hf_columns(path)
    suffix = path.suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise ValueError(f"{path}: unsupported file type {suffix!r}; valid: {', '.join(TABLE_SUFFIXES)}")
    _check_not_empty(path)
    if suffix == ".parquet":
        return list(parquet_schema(path))
    if suffix in (".csv", ".tsv"):
        first = read_utf8(path).split("\n", 1)[0].removesuffix("\r")
        quoting = csv.QUOTE_NONE if suffix == ".tsv" else csv.QUOTE_MINIMAL
        delimiter = "\t" if suffix == ".tsv" else ","
        return next(csv.reader([first], delimiter=delimiter, quoting=quoting), [])
    for _, obj in read_jsonl_objects(path):
        return list(obj)
    raise DataError(path, "no JSON objects: nothing to read")


# ---- column checks shared by the readers -------------------------------------------------------

def require_columns(table: Table, required: list[str]) -> None:
    missing = [c for c in required if c not in table.frame.columns]
    if missing:
        raise table.whole_file_error(f"missing column(s) {', '.join(missing)}; the file has "
                                     f"{', '.join(table.frame.columns) or 'no columns'}")


def _raise_first(table: Table, mask: pl.Series, problem) -> None:
    """Raise at the first row where ``mask`` is true; ``problem(index)`` words the error."""
    bad = mask.arg_true()
    if len(bad):
        first = int(bad[0])
        more = f" ({len(bad)} rows have this problem; the first is shown)" if len(bad) > 1 else ""
        raise table.error(first, problem(first) + more)


def check_text_column(table: Table, column: str) -> pl.Series:
    """The column as strings; error at the first null, non-string, empty (whitespace-only) value or
    value holding a NUL character (an export accident, never text; it is refused, not stripped)."""
    series = table.frame[column]
    if series.dtype == pl.Null:  # every value null (e.g. a JSONL key that is always null)
        _raise_first(table, pl.Series([True] * len(series)), lambda i: f"{column} is missing (null)")
        return series.cast(pl.String)
    if series.dtype != pl.String:
        first = int(series.is_not_null().arg_true()[0]) if series.null_count() < len(series) else 0
        raise table.error(first, f"{column} must be text, but the column holds {series.dtype}")
    _raise_first(table, series.is_null(), lambda i: f"{column} is missing (null)")
    _raise_first(table, series.str.strip_chars().str.len_chars() == 0,
                 lambda i: f"{column} is empty")
    _raise_first(table, series.str.contains("\x00", literal=True),
                 lambda i: f"{column} contains a NUL character (\\x00) (remove it from the file)")
    return series


def check_float_column(table: Table, column: str) -> pl.Series:
    """The column as finite Float64; error at the first null, non-numeric or non-finite value."""
    series = table.frame[column]
    _raise_first(table, series.is_null(), lambda i: f"{column} is missing")
    if series.dtype == pl.String:
        as_float = series.str.strip_chars().cast(pl.Float64, strict=False)
        _raise_first(table, as_float.is_null(),
                     lambda i: f"{column} is not a number: {series[i]!r}")
    elif series.dtype.is_numeric() or series.dtype == pl.Boolean:
        as_float = series.cast(pl.Float64)
    else:
        raise table.error(0, f"{column} must be numeric, but the column holds {series.dtype}")
    _raise_first(table, ~as_float.is_finite(), lambda i: f"{column} is not finite: {as_float[i]}")
    return as_float


def check_split_column(table: Table, default: str = "train", canonical: bool = True) -> pl.Series:
    """The ``split`` column as strings, or ``default`` for every row when the file has none.

    ``canonical``: names become train / dev / test (``validation``/``valid``/``val`` are dev, any case);
    a name that is none of these is an error listing the splits the file has."""
    if "split" not in table.frame.columns:
        return pl.Series("split", [default] * table.frame.height, dtype=pl.String)
    raw = check_text_column(table, "split").str.strip_chars()
    if not canonical:
        return raw
    named = raw.str.to_lowercase().replace_strict(SPLIT_ALIASES, default=None, return_dtype=pl.String)
    found = ", ".join(repr(s) for s in sorted(raw.unique().to_list()))
    _raise_first(table, named.is_null(),
                 lambda i: f"split {raw[i]!r} is not recognised; the file's splits are {found} ({SPLIT_HELP})")
    return named.alias("split")
