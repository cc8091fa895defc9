"""The texts to featurize, read in chunks so a corpus never has to fit in memory.

Plain-text corpora -- a `.txt` file (one passage per line) or a Parquet text column -- are streamed:
a `.txt` line by line, a Parquet file by record batches. They yield exactly what
`load_dataset(path).texts()` lists (lines stripped and blank lines skipped; Parquet values as they
are, empty ones skipped and counted; a NUL character or a null refused naming the line or row, by the
readers' own checks), in the same order. The labelled formats (BEIR, STS, pairs) are small by nature
and read whole with `load_dataset`. Every source is opened -- existence,
format, emptiness -- before any store is created.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from headstore.data.dataset import load_dataset, resolve_data_path
from headstore.data.errors import DataError
from headstore.data.readers import (TEXT_FILE_SUFFIXES, check_passage_values, passage_of_line,
                                    string_columns)
from headstore.data.unlabeled import UNLABELED, read_unlabeled

CHUNK_ROWS = 65536  # texts read at a time from a streamed file


@dataclass
class Source:
    path: Path  # the file or BEIR folder read
    kind: str  # txt | parquet | dataset
    column: str | None = None  # Parquet text column
    texts: dict[str, list[str]] | None = None  # dataset: role -> its texts, read up front (small)
    skipped: int = 0  # empty passages skipped (counted while streaming)
    n_texts: int = 0  # texts yielded so far

    def chunks(self, chunk_rows: int = CHUNK_ROWS) -> Iterator[tuple[str, list[str]]]:
        """(role, texts) chunks: a plain corpus is documents; a dataset's queries (BEIR, query-document
        pairs) come in the query role."""
        if self.kind == "dataset":
            produced = self._dataset_chunks(chunk_rows)
        else:
            produced = (("document", c) for c in {"txt": self._txt_chunks, "parquet": self._parquet_chunks}[self.kind](chunk_rows))
        for role, chunk in produced:
            self.n_texts += len(chunk)
            yield role, chunk
        if self.n_texts == 0:
            raise DataError(self.path, "no texts to featurize (an empty or header-only file"
                            + (f"; {self.skipped} empty value(s) skipped" if self.skipped else "")
                            + "); give a file with texts")

    def _dataset_chunks(self, chunk_rows: int) -> Iterator[tuple[str, list[str]]]:
        for role, texts in self.texts.items():
            for start in range(0, len(texts), chunk_rows):
                yield role, texts[start:start + chunk_rows]

    def _txt_chunks(self, chunk_rows: int) -> Iterator[list[str]]:
        chunk: list[str] = []
        with open(self.path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(self.path, f"not valid UTF-8 ({e.reason} at byte {e.start} of "
                                    "the line)", line=number) from None
                if number == 1:
                    line = line.removeprefix("\ufeff")  # a byte-order mark
                text = passage_of_line(self.path, number, line)
                if text:
                    chunk.append(text)
                    if len(chunk) >= chunk_rows:
                        yield chunk
                        chunk = []
        if chunk:
            yield chunk

    def _parquet_chunks(self, chunk_rows: int) -> Iterator[list[str]]:
        import pyarrow.parquet as pq  # here: ~0.5 s to import, needed by parquet inputs only

        row = 0
        for batch in pq.ParquetFile(self.path).iter_batches(batch_size=chunk_rows,
                                                            columns=[self.column]):
            values = batch.column(0).to_pylist()
            check_passage_values(self.path, self.column, values, row)
            kept = [v for v in values if v.strip()]
            self.skipped += len(values) - len(kept)
            row += len(values)
            if kept:
                yield kept


def open_source(path: str | Path, fmt: str | None) -> Source:
    """Check one --data input and say how to read it (no texts read, except small datasets). An --unlabeled
    file (format UNLABELED) is read whole, as the tasks read it (data.unlabeled): documents."""
    if fmt == UNLABELED:
        return Source(Path(path), "dataset", texts={"document": read_unlabeled([path]).texts})
    resolved = resolve_data_path(path)
    if fmt and fmt.startswith("pairs?"):  # pairs?roles=query-document (--pair-roles): read whole, by role
        return _dataset_source(resolved, fmt)
    suffix = resolved.suffix.lower() if resolved.is_file() else ""
    if resolved.is_file() and resolved.stat().st_size == 0:
        raise DataError(resolved, "empty file (0 bytes): no texts to featurize")
    if fmt == "text" and suffix in TEXT_FILE_SUFFIXES:
        return Source(resolved, "txt")
    if fmt == "text" and suffix == ".parquet":
        import pyarrow.parquet as pq  # here: as above

        try:
            meta = pq.ParquetFile(resolved).metadata
            strings = string_columns(resolved)
        except Exception as err:
            raise DataError(resolved, f"not a readable Parquet file ({type(err).__name__}: {err})") from None
        names = pq.ParquetFile(resolved).schema_arrow.names
        column = "text" if "text" in names else (strings[0] if len(strings) == 1 else None)
        if column is None:
            raise DataError(resolved, f"no 'text' column and not exactly one text column "
                            f"(text columns: {', '.join(strings) or 'none'})")
        if meta.num_rows == 0:
            raise DataError(resolved, "no rows (a header-only file): no texts to featurize")
        return Source(resolved, "parquet", column=column)
    return _dataset_source(resolved, fmt)


def _dataset_source(resolved: Path, fmt: str) -> Source:
    texts = load_dataset(resolved, format=fmt).texts_by_role()
    if not any(texts.values()):
        raise DataError(resolved, "no texts to featurize (an empty or header-only file)")
    return Source(resolved, "dataset", texts={role: t for role, t in texts.items() if t})


def open_sources(data_paths: Sequence[str | Path], formats: Sequence[str | None] | None,
                 unlabeled: Sequence[str | Path] = ()) -> list[Source]:
    """The sources of the --data inputs (one format for all, or one per input) and then the --unlabeled files."""
    formats = list(formats) if formats else [None] * len(data_paths)
    if len(formats) == 1 and len(data_paths) > 1:
        formats = formats * len(data_paths)
    if len(formats) != len(data_paths):
        raise ValueError(f"give one format for all datasets or one per dataset "
                         f"({len(data_paths)} datasets, {len(formats)} formats)")
    if not data_paths and not unlabeled:
        raise ValueError("no --data or --unlabeled given: nothing to featurize")
    paths = [*data_paths, *unlabeled]
    return [open_source(path, fmt) for path, fmt in zip(paths, [*formats, *[UNLABELED] * len(unlabeled)])]


def windows(chunks: Iterable[tuple[str, list[str]]], window_texts: int) -> Iterator[tuple[str, list[str]]]:
    """Cut a stream of (key, chunk) into (key, window)s of exactly window_texts texts of one key (the last
    of a run of one key may be shorter). The key is the prompt the texts are encoded under: roles that share
    a prompt share windows.

    Window boundaries depend on the input alone, so a rerun cuts the same windows (resume)."""
    window: list[str] = []
    window_role = None
    for role, chunk in chunks:
        if window and role != window_role:
            yield window_role, window
            window = []
        window_role = role
        start = 0
        while start < len(chunk):
            take = chunk[start:start + window_texts - len(window)]
            window.extend(take)
            start += len(take)
            if len(window) == window_texts:
                yield role, window
                window = []
    if window:
        yield window_role, window


def all_chunks(sources: Sequence[Source], chunk_rows: int = CHUNK_ROWS) -> Iterator[tuple[str, list[str]]]:
    for source in sources:
        yield from source.chunks(chunk_rows)
