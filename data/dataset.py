"""One entry point for every dataset: detect its format, read it, list the texts it needs encoded.

``load_dataset(path)`` accepts a file or a folder. A folder is a BEIR dataset when it holds
``corpus.jsonl``; a folder written by Hugging Face ``datasets.save_to_disk`` (data.hf) is read as a table of
its columns (a DatasetDict's splits as the split column); otherwise it must hold exactly one data file (Parquet/CSV/TSV/JSONL, else a single
.txt that is not a README/LICENSE), which is then read — so ``datasets/stsb`` (stsb.parquet beside
README.md and LICENSE.txt) works, and a folder with several data files asks for one to be named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import polars as pl

from headstore.data.beir import BeirData, read_beir
from headstore.data.hf import is_hf_dataset_dir
from headstore.data.labels import LabelSpec, is_label_format, read_labels_counted
from headstore.data.readers import (TEXT_FILE_SUFFIXES, pair_columns, read_pairs, read_sts_ranged, read_text_counted,
                                    string_columns)
from headstore.data.tables import TABLE_SUFFIXES, table_columns
from headstore.data.text_id import doc_text

NOT_DATA_PREFIXES = ("readme", "license", "licence", "copying", "notice")  # docs beside the data


def _frames_beir(path: Path, score_range=None) -> tuple[dict[str, pl.DataFrame], int, None]:
    beir = read_beir(path)
    frames = {"corpus": beir.corpus, "queries": beir.queries}
    frames.update({f"qrels/{split}": qrels for split, qrels in beir.qrels.items()})
    return frames, 0, None


def _frames_sts(path: Path, score_range=None):
    frame, found = read_sts_ranged(path, score_range)
    return {"sts": frame}, 0, found


def _frames_text(path: Path, score_range=None) -> tuple[dict[str, pl.DataFrame], int, None]:
    frame, skipped = read_text_counted(path)
    return {"text": frame}, skipped, None


def _frames_labels(path: Path, spec: LabelSpec) -> tuple[dict[str, pl.DataFrame], int, None]:
    frame, skipped = read_labels_counted(path, spec)
    return {"labels": frame}, skipped, None


# format name -> reader(path, score_range) giving (frames, rows skipped, score range or None);
# the CLI offers sorted(FORMATS)
FORMATS: dict[str, Callable[..., tuple[dict[str, pl.DataFrame], int, tuple[float, float] | None]]] = {
    "beir": _frames_beir,
    "sts": _frames_sts,
    "pairs": lambda path, score_range=None: ({"pairs": read_pairs(path)}, 0, None),
    "text": _frames_text,
    "labels": lambda path, score_range=None: _frames_labels(path, LabelSpec()),
}


def _valid_formats_hint() -> str:
    return f"valid formats: {', '.join(sorted(FORMATS))}; name one with --format"


def resolve_data_path(path: str | Path) -> Path:
    """The file to read for ``path``: the path itself for a file or a BEIR folder, else the one data
    file inside the folder."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or folder (check the --data path)")
    if (path / "corpus.jsonl").is_file() or is_hf_dataset_dir(path):  # BEIR, or a datasets.save_to_disk folder
        return path
    files = sorted(p for p in path.iterdir() if p.is_file())
    tables = [p for p in files if p.suffix.lower() in TABLE_SUFFIXES]
    texts = [p for p in files if p.suffix.lower() in TEXT_FILE_SUFFIXES
             and not p.name.lower().startswith(NOT_DATA_PREFIXES)]
    candidates = tables or texts
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise ValueError(f"{path}: no data file found (expected corpus.jsonl for BEIR, or one of "
                         f"{', '.join(TABLE_SUFFIXES + TEXT_FILE_SUFFIXES)})")
    raise ValueError(f"{path}: holds several data files ({', '.join(p.name for p in candidates)}); "
                     "name the one to load")


def _format_from_columns(columns: list[str], path: Path) -> str:
    if {"sentence1", "sentence2", "score"} <= set(columns):
        return "sts"
    if pair_columns(columns) is not None:
        return "pairs"
    if {"text", "label"} <= set(columns):
        return "labels"
    if (path.suffix.lower() == ".parquet" or is_hf_dataset_dir(path)) and (
            "text" in columns or len(string_columns(path)) == 1):
        return "text"
    raise ValueError(f"{path}: cannot tell the format from its columns ({', '.join(columns)}): "
                     "sts needs sentence1, sentence2, score; pairs needs anchor, positive; "
                     f"labels needs text, label; text needs a Parquet text column; {_valid_formats_hint()}")


def detect_format(path: str | Path) -> str:
    """The format name (a key of ``FORMATS``) of a file or folder; ValueError when it is unclear."""
    resolved = resolve_data_path(path)
    if is_hf_dataset_dir(resolved):
        return _format_from_columns(table_columns(resolved), resolved)
    if resolved.is_dir():
        return "beir"
    suffix = resolved.suffix.lower()
    if suffix in TEXT_FILE_SUFFIXES:
        return "text"
    if suffix in TABLE_SUFFIXES:
        return _format_from_columns(table_columns(resolved), resolved)
    raise ValueError(f"{resolved}: unknown file type {suffix!r}; {_valid_formats_hint()}")


@dataclass
class Dataset:
    name: str  # folder name (BEIR, or a folder holding one file) or file stem
    kind: str  # a key of FORMATS
    path: Path  # the file or BEIR folder actually read
    frames: dict[str, pl.DataFrame]  # beir: corpus, queries, qrels/<split>; else {kind: frame}
    skipped: int = 0  # rows skipped as empty (read_text on Parquet, labels); 0 for the other formats
    score_range: tuple[float, float] | None = None  # sts: the scale of `score` (declared or detected)
    spec: object | None = None  # labels: the LabelSpec it was read with (columns, hierarchy)
    pair_roles: str = "symmetric"  # pairs: symmetric, or query-document (anchor = query, the rest documents)
    _texts: list[str] | None = field(default=None, repr=False)

    @property
    def frame(self) -> pl.DataFrame:
        """The single frame of an sts/pairs/text dataset."""
        if self.kind == "beir":
            raise ValueError(f"{self.name}: a BEIR dataset has several frames: {sorted(self.frames)}")
        return self.frames[self.kind]

    @property
    def qrels(self) -> dict[str, pl.DataFrame]:
        """split -> qrels frame (BEIR only; empty for the other formats)."""
        return {k.removeprefix("qrels/"): v for k, v in self.frames.items() if k.startswith("qrels/")}

    @property
    def beir(self) -> BeirData:
        """The BEIR frames as a ``BeirData`` (corpus, queries, qrels by split)."""
        if self.kind != "beir":
            raise ValueError(f"{self.name}: a {self.kind!r} dataset has no BEIR frames")
        return BeirData(corpus=self.frames["corpus"], queries=self.frames["queries"],
                        qrels=self.qrels, path=self.path)

    def splits(self) -> list[str]:
        """The splits present: qrels files for BEIR, values of the ``split`` column otherwise."""
        if self.kind == "beir":
            return sorted(self.qrels)
        return sorted(self.frame["split"].unique().to_list())

    def texts(self) -> list[str]:
        """Every text the dataset needs encoded, unique, in order of first appearance.

        beir: documents as ``doc_text(title, text)``, then query texts; sts: sentence1 then sentence2
        column; pairs: anchor, positive, negative columns; text: the passages.
        """
        if self._texts is None:
            if self.kind == "beir":
                corpus = self.frames["corpus"]
                docs = [doc_text(t, x) for t, x in zip(corpus["title"], corpus["text"])]
                parts = [docs, self.frames["queries"]["text"].to_list()]
            else:
                columns = {"sts": ["sentence1", "sentence2"],
                           "pairs": ["anchor", "positive", "negative"], "text": ["text"],
                           "labels": ["text"]}[self.kind]
                parts = [self.frame[c].to_list() for c in columns if c in self.frame.columns]
            self._texts = list(dict.fromkeys(t for part in parts for t in part))
        return self._texts

    def role_of(self, column: str) -> str:
        """The role (data.text_id.ROLES) a column's texts are encoded in: BEIR queries are queries and its
        corpus documents; a pairs table read as query-document has query anchors; everything else is
        symmetric and takes the document role (the plain one: most instruction models prompt queries only)."""
        if column == "queries" or (column == "anchor" and self.pair_roles == "query-document"):
            return "query"
        return "document"

    def texts_by_role(self) -> dict[str, list[str]]:
        """`texts()` split by role: {"document": [...], "query": [...]} (each unique, in order)."""
        if self.kind == "beir":
            corpus = self.frames["corpus"]
            by_column = {"corpus": [doc_text(t, x) for t, x in zip(corpus["title"], corpus["text"])],
                         "queries": self.frames["queries"]["text"].to_list()}
        elif self.kind == "pairs":
            by_column = {c: self.frame[c].to_list() for c in ("anchor", "positive", "negative") if c in self.frame.columns}
        else:
            return {"document": self.texts(), "query": []}
        out: dict[str, list[str]] = {"document": [], "query": []}  # documents first, as texts() lists them
        for column, texts in by_column.items():
            out[self.role_of(column)].extend(texts)
        return {role: list(dict.fromkeys(texts)) for role, texts in out.items()}


def load_dataset(path: str | Path, format: str | None = None, score_range=None) -> Dataset:
    """Read the dataset at ``path`` (file or folder), detecting its format unless given.

    ``score_range`` (STS only): None reads the scores unchecked (only the texts are wanted, e.g. by
    featurize); ``"detect"`` detects a 0-1 or 0-5 scale; (LO, HI) declares it, and a score outside
    is an error naming its row."""
    path = Path(path)
    spec = None
    format, pair_roles = split_pair_roles(format)
    if is_label_format(format):  # "labels" or "labels?text_column=body&..." (options: data/labels.py)
        format, spec = "labels", LabelSpec.from_format(format)
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; valid formats: {', '.join(sorted(FORMATS))}")
    resolved = resolve_data_path(path)
    kind = format or detect_format(resolved)
    if kind == "beir" and not resolved.is_dir():
        raise ValueError(f"{resolved}: the beir format reads a folder holding corpus.jsonl")
    if kind == "labels":
        spec = spec or LabelSpec()
        frames, skipped, found = _frames_labels(resolved, spec)
    else:
        frames, skipped, found = FORMATS[kind](resolved, score_range)
    name = path.resolve().name if path.is_dir() else path.stem
    if pair_roles != "symmetric" and kind != "pairs":
        raise ValueError(f"{resolved}: --pair-roles {pair_roles} applies to a pairs table; this is a {kind!r} dataset")
    return Dataset(name=name, kind=kind, path=resolved, frames=frames, skipped=skipped, score_range=found,
                   spec=spec, pair_roles=pair_roles)


PAIR_ROLES = ("symmetric", "query-document")  # --pair-roles: how a pairs table's columns take the roles


def split_pair_roles(format: str | None) -> tuple[str | None, str]:
    """("pairs", "query-document") from the format string "pairs?roles=query-document" that `--pair-roles`
    folds into (data.options); other formats pass through with symmetric roles."""
    if not format or not format.startswith("pairs?"):
        return format, "symmetric"
    key, _, value = format.removeprefix("pairs?").partition("=")
    if key != "roles" or value not in PAIR_ROLES:
        raise ValueError(f"format {format!r}: give pairs?roles=ROLES with ROLES one of {list(PAIR_ROLES)}")
    return None, value  # detected: a table that is not pairs is then refused by name
