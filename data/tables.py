"""Tabular files (Parquet, CSV, TSV, JSONL) into polars frames that remember where each row came from.

The readers in ``readers.py`` validate columns; when a value is bad they need to say *where* it is.
A ``Table`` pairs the frame with that position: 0-based row numbers for Parquet, 1-based line numbers
(header line counted) for text files. CSV/TSV/JSONL are parsed with the standard library so the line
numbers are exact (a quoted CSV field may span lines; ``csv`` tracks that) and a ragged row is reported
at its own line instead of as a parser failure somewhere in the file.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import polars as pl

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

    def whole_file_error(self, problem: str) -> DataError:
        return DataError(self.path, problem)


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its \\n or \\r\\n) for every line of a UTF-8 file."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DataError(path, f"not valid UTF-8 ({e.reason} at byte {e.start})", line=line) from None
    if text.startswith("\ufeff"):  # a byte-order mark written by some editors
        text = text[1:]
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
    with path.open(newline="", encoding="utf-8-sig") as f:
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
        except UnicodeDecodeError as e:
            raise DataError(path, f"not valid UTF-8 ({e.reason})") from None
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


def read_table(path: str | Path) -> Table:
    """Read a Parquet, CSV, TSV or JSONL file; ValueError for any other suffix."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "no such file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            return Table(pl.read_parquet(path), path, None)
        except Exception as e:  # pyarrow/polars raise many types for a corrupt file
            raise DataError(path, f"cannot read Parquet: {e}") from None
    if suffix == ".csv":
        return _read_delimited(path, ",")
    if suffix == ".tsv":
        return _read_delimited(path, "\t")
    if suffix == ".jsonl":
        return _read_jsonl_table(path)
    raise ValueError(f"{path}: unsupported file type {suffix!r}; valid: {', '.join(TABLE_SUFFIXES)}")


def table_columns(path: str | Path) -> list[str]:
    """Column names of a table file without reading its body (for format detection)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return list(pl.read_parquet_schema(path))
    if suffix in (".csv", ".tsv"):
        with path.open(newline="", encoding="utf-8-sig") as f:
            quoting = csv.QUOTE_NONE if suffix == ".tsv" else csv.QUOTE_MINIMAL
            delimiter = "\t" if suffix == ".tsv" else ","
            return next(csv.reader(f, delimiter=delimiter, quoting=quoting), [])
    if suffix == ".jsonl":
        for _, obj in read_jsonl_objects(path):
            return list(obj)
        return []
    raise ValueError(f"{path}: unsupported file type {suffix!r}; valid: {', '.join(TABLE_SUFFIXES)}")


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
    """The column as strings; error at the first null, non-string or empty (whitespace-only) value."""
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


def check_split_column(table: Table, default: str = "train") -> pl.Series:
    """The ``split`` column as strings, or ``default`` for every row when the file has none."""
    if "split" not in table.frame.columns:
        return pl.Series("split", [default] * table.frame.height, dtype=pl.String)
    return check_text_column(table, "split").str.strip_chars()
