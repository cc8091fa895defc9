"""The one error type the readers raise for bad input files.

Every message names the file, the place in it and the problem, so a user can open the file and
fix it: ``corpus.jsonl:12: missing "_id"`` for text files (1-based line numbers, the header line
counted) and ``pairs.parquet: row 3: anchor is empty`` for Parquet (0-based row numbers, as
polars / pyarrow count them).
"""

from __future__ import annotations

from pathlib import Path


class DataError(ValueError):
    """A data file that cannot be read as its format requires.

    Subclasses ``ValueError`` so callers that treat bad user input uniformly (the CLI) catch it.
    ``line`` is a 1-based line number (text files), ``row`` a 0-based row number (Parquet);
    at most one of them is given, and neither for whole-file problems (a missing column).
    """

    def __init__(self, path: str | Path, problem: str, *, line: int | None = None,
                 row: int | None = None):
        assert line is None or row is None, "give a line or a row, not both"
        self.path = str(path)
        self.problem = problem
        self.line = line
        self.row = row
        if line is not None:
            message = f"{self.path}:{line}: {problem}"
        elif row is not None:
            message = f"{self.path}: row {row}: {problem}"
        else:
            message = f"{self.path}: {problem}"
        super().__init__(message)


class SettingError(ValueError):
    """A setting of a config class out of its range: `setting` names the field, `problem` what is wrong with it.

    The message is ``{setting} {problem}`` (``anchor_weight must be a finite number >= 0, got -1.0``): what a
    config file or the API names. Where the value came from a command-line option, the command line names the
    option as typed instead (heads.settings.options.named_as_typed: ``--anchor-weight must be ...``).
    """

    def __init__(self, setting: str, problem: str):
        self.setting, self.problem = setting, problem
        super().__init__(f"{setting} {problem}")


class SystemFailure(RuntimeError):
    """The machine failed the command (worker processes that keep dying, a service that went away): neither
    the input's fault nor a bug. The CLI shows it as one line, as an OS error (exit code 1)."""
