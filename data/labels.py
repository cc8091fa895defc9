"""Labelled texts: a ``text`` + ``label`` table (Parquet/CSV/TSV/JSONL), flat or hierarchical labels.

- ``text_column`` / ``label_column`` name the columns (20 Newsgroups: ``body``, since its ``text``
  column keeps the headers, which name the newsgroup).
- Hierarchies: ``label_sep`` splits a label into levels (``comp.sys.mac.hardware`` with ``.``,
  ``DESC:manner`` with ``:``), or ``label_columns`` names one column per level, coarse to fine, the
  last being the label (``level1,level2,label``). A node is identified by its whole path from the root.
- ``split`` as usual (all ``train`` when absent).

The options travel as a format string, ``labels?text_column=body&label_sep=.`` (what the CLI's
``--text-column``, ``--label-column``, ``--label-sep``, ``--label-columns`` build), so every command
that takes ``--format`` passes them on unchanged (featurize, train-head, grid, eval, finetune).

Bad input is an error naming the file and row: a missing column, a missing (null/empty) label, a
label with an empty level, a label whose parent levels differ between rows, one class only. Empty
texts are skipped and counted (20 Newsgroups has 34 empty bodies); labels that occur only outside
train are counted and reported (``unseen_labels``), since no classifier can predict them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

import polars as pl

from headstore.data.tables import Table, check_split_column, read_table

log = logging.getLogger(__name__)

LABEL_FORMAT = "labels"


@dataclass(frozen=True)
class LabelSpec:
    text_column: str = "text"  # the text to encode
    label_column: str = "label"  # the class (the leaf, when levels come from label_columns)
    label_sep: str | None = None  # split labels into levels on this string (hierarchy)
    label_columns: tuple[str, ...] = ()  # one column per level, coarse to fine (hierarchy)

    def __post_init__(self):
        if self.label_sep == "":
            raise ValueError("--label-sep must be a non-empty string")
        if self.label_sep is not None and self.label_columns:
            raise ValueError("give --label-sep or --label-columns, not both")
        if self.label_columns and len(set(self.label_columns)) != len(self.label_columns):
            raise ValueError(f"--label-columns repeats a column: {','.join(self.label_columns)}")

    @property
    def hierarchical(self) -> bool:
        return self.label_sep is not None or len(self.label_columns) > 1

    @property
    def leaf_column(self) -> str:
        return self.label_columns[-1] if self.label_columns else self.label_column

    def to_format(self) -> str:
        """``labels`` plus the settings that differ from the defaults, as a query string."""
        default = LabelSpec()
        options = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)}
        if "label_columns" in options:
            options["label_columns"] = ",".join(self.label_columns)
        return LABEL_FORMAT + ("?" + urlencode(options) if options else "")

    @classmethod
    def from_format(cls, fmt: str) -> "LabelSpec":
        kind, _, query = fmt.partition("?")
        if kind != LABEL_FORMAT:
            raise ValueError(f"{fmt!r} is not a labels format (labels or labels?text_column=...)")
        valid = {f.name for f in fields(cls)}
        options = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
        unknown = sorted(set(options) - valid)
        if unknown:
            raise ValueError(f"format {fmt!r}: unknown option(s) {unknown}; valid: {sorted(valid)}")
        if "label_columns" in options:
            options["label_columns"] = tuple(c.strip() for c in options["label_columns"].split(",") if c.strip())
        return cls(**options)


def is_label_format(fmt: str | None) -> bool:
    return fmt is not None and fmt.partition("?")[0] == LABEL_FORMAT


def label_format(fmt: str | None, text_column=None, label_column=None, label_sep=None,
                 label_columns=None) -> str | None:
    """The format string for the CLI's label options (None when no option is given: detect).

    Options imply the labels format; with another ``--format`` they are an error."""
    given = {k: v for k, v in (("text_column", text_column), ("label_column", label_column),
                               ("label_sep", label_sep), ("label_columns", label_columns)) if v is not None}
    if not given:
        return fmt
    if fmt is not None and not is_label_format(fmt):
        raise ValueError(f"--{next(iter(given)).replace('_', '-')} applies to --format labels, not {fmt!r}")
    spec = LabelSpec.from_format(fmt) if fmt else LabelSpec()
    if "label_columns" in given:
        given["label_columns"] = tuple(c.strip() for c in given["label_columns"].split(",") if c.strip())
    return LabelSpec(**{**{f.name: getattr(spec, f.name) for f in fields(spec)}, **given}).to_format()


# ---- reading ------------------------------------------------------------------------------------

def _string_values(table: Table, column: str, what: str) -> list[str]:
    """The column as stripped strings; integers are accepted (class ids), and whole numbers in a float
    column (1.0: a column that once held a NaN); null/empty/NaN is an error naming the row."""
    series = table.frame[column]
    if series.dtype.is_float():
        missing = (series.is_null() | series.is_nan()).fill_null(True).arg_true()
        if len(missing):
            more = f" ({len(missing)} rows have no {what}; the first is shown)" if len(missing) > 1 else ""
            raise table.error(int(missing[0]), f"{what} {column!r} is missing (null or NaN){more}")
        fraction = (~series.is_finite() | (series != series.floor())).arg_true()
        if len(fraction):
            raise table.error(int(fraction[0]), f"{what} {column!r} is {series[int(fraction[0])]}: "
                              "not a class (give text or whole numbers)")
        series = series.cast(pl.Int64)
    if series.dtype.is_integer():
        series = series.cast(pl.String)
    elif series.dtype not in (pl.String, pl.Null):
        raise table.whole_file_error(f"{what} column {column!r} must hold text or integers, not {series.dtype}")
    series = series.cast(pl.String).str.strip_chars()
    missing = (series.is_null() | (series.str.len_chars() == 0)).arg_true()
    if len(missing):
        more = f" ({len(missing)} rows have no {what}; the first is shown)" if len(missing) > 1 else ""
        raise table.error(int(missing[0]), f"{what} {column!r} is missing{more}")
    return series.to_list()


AUTO_SEP = "auto"  # --label-sep auto: the separator detect_label_sep finds (flat labels when none)
LABEL_SEPS = (":", ".", "/", ">")  # separators a hierarchy is looked for under, in this order (TREC's COARSE:fine
# before 20 Newsgroups' a.b.c: `topic:comp.graphics` is read on ':')


def detect_label_sep(labels) -> str | None:
    """The separator that makes the labels a hierarchy, or None: the first of LABEL_SEPS that splits every
    label into non-empty parts and whose top level groups the labels (at least 2 top nodes, fewer than the
    labels: some node has two children)."""
    names = sorted(set(labels))
    for sep in LABEL_SEPS:
        parts = [name.split(sep) for name in names]
        if all(len(p) > 1 and all(x.strip() for x in p) for p in parts):
            tops = {p[0].strip() for p in parts}
            if 2 <= len(tops) < len(names):
                return sep
    return None


def hierarchy_note(labels, spec: LabelSpec) -> str | None:
    """The note for flat labels that look hierarchical (None otherwise): which separator, and the option."""
    sep = None if spec.hierarchical else detect_label_sep(labels)
    if sep is None:
        return None
    return f"note: your labels look hierarchical (sep {sep!r}); --label-sep {sep!r} uses it"


def _labels_and_paths(table: Table, spec: LabelSpec) -> tuple[list[str], list[tuple[str, ...]]]:
    """The label (leaf) and its path (root to leaf) of every row (`--label-sep auto`: split on the detected
    separator, flat labels when none is found)."""
    if not spec.label_columns:
        labels = _string_values(table, spec.label_column, "label")
        sep = detect_label_sep(labels) if spec.label_sep == AUTO_SEP else spec.label_sep
        if spec.label_sep == AUTO_SEP:
            log.warning("%s: --label-sep auto: %s", table.path,
                        f"labels split on {sep!r}" if sep else "no separator makes these labels a hierarchy "
                        f"(looked for {' '.join(LABEL_SEPS)}): flat labels")
        if sep is None:
            return labels, [(label,) for label in labels]
        paths = []
        for i, label in enumerate(labels):
            parts = tuple(p.strip() for p in label.split(sep))
            if not all(parts):
                raise table.error(i, f"label {label!r} has an empty level when split on {sep!r}")
            paths.append(parts)
        return labels, paths
    paths = list(zip(*[_string_values(table, c, "label level") for c in spec.label_columns]))
    first: dict[str, tuple[int, tuple[str, ...]]] = {}
    for i, path in enumerate(paths):  # a label has one place in the tree
        seen = first.setdefault(path[-1], (i, path))
        if seen[1] != path:
            raise table.error(i, f"label {path[-1]!r} has the levels {' > '.join(path)} here but "
                              f"{' > '.join(seen[1])} at {_place(table, seen[0])}")
    return [p[-1] for p in paths], paths


def _place(table: Table, index: int) -> str:
    return f"row {index}" if table.lines is None else f"line {table.lines[index]}"


def read_labels_counted(path: str | Path, spec: LabelSpec = LabelSpec()) -> tuple[pl.DataFrame, int]:
    """(frame, number of empty texts skipped). Frame: ``text``, ``label`` (the leaf), ``split``,
    ``label_path`` (list of levels, root to leaf), then the file's other columns."""
    table = read_table(path)
    columns = table.frame.columns
    needed = [spec.text_column] + (list(spec.label_columns) or [spec.label_column])
    missing = [c for c in needed if c not in columns]
    if missing:
        hint = " (name them with --text-column / --label-column / --label-columns)"
        raise table.whole_file_error(f"missing column(s) {', '.join(missing)}; the file has "
                                     f"{', '.join(columns) or 'no columns'}{hint}")
    texts = table.frame[spec.text_column]
    if texts.dtype not in (pl.String, pl.Null):
        raise table.whole_file_error(f"text column {spec.text_column!r} must be text, not {texts.dtype}")
    nulls = texts.is_null().arg_true()
    if len(nulls):
        raise table.error(int(nulls[0]), f"{spec.text_column} is missing (null)"
                          + (f" ({len(nulls)} rows)" if len(nulls) > 1 else ""))
    labels, paths = _labels_and_paths(table, spec)
    empty = (texts.str.strip_chars().str.len_chars() == 0).to_numpy()
    skipped = int(empty.sum())
    if skipped:
        rows = [_place(table, int(i)) for i in empty.nonzero()[0][:5]]
        log.warning("%s: skipped %d empty %r value(s) (%s%s)", table.path, skipped, spec.text_column,
                    ", ".join(rows), ", ..." if skipped > 5 else "")
    rest = table.frame.drop([c for c in {spec.text_column, spec.label_column, "text", "label", "split",
                                         "label_path"} if c in columns])
    frame = pl.concat([pl.DataFrame({
        "text": texts, "label": pl.Series(labels, dtype=pl.String),
        "split": check_split_column(table),
        "label_path": pl.Series([list(p) for p in paths], dtype=pl.List(pl.String))}), rest],
        how="horizontal").filter(pl.Series(~empty))
    labels = frame["label"].unique()
    if len(labels) < 2:
        raise table.whole_file_error(f"a single class ({labels.to_list()!r}): classification needs at least two "
                                     f"labels in {spec.leaf_column!r}")
    note = hierarchy_note(frame.filter(pl.col("split") == "train")["label"].to_list(), spec)
    if note:
        log.warning("%s: %s", table.path, note)
    for split, counts in unseen_labels(frame).items():
        log.warning("%s: %d %s text(s) carry %d label(s) absent from train: %s", table.path,
                    sum(counts.values()), split, len(counts), ", ".join(sorted(counts)[:10]))
    return frame, skipped


def unseen_labels(frame: pl.DataFrame) -> dict[str, dict[str, int]]:
    """split -> {label: number of texts} for labels that never occur in the train split."""
    train = set(frame.filter(pl.col("split") == "train")["label"].to_list())
    out: dict[str, dict[str, int]] = {}
    for split, label, n in (frame.filter(~pl.col("label").is_in(list(train)))
                            .group_by("split", "label").len().sort("split", "label").iter_rows()):
        out.setdefault(split, {})[label] = int(n)
    return out
