"""A folder written by Hugging Face `datasets` (`save_to_disk` of a Dataset or a DatasetDict) read as a table.

Recognised by its own files only: `dataset_dict.json` (a DatasetDict: one sub-folder per split) or
`dataset_info.json` + `state.json` (a Dataset). It is read through the `datasets` library (the `hf` extra),
memory-mapped Arrow handed to polars without Python objects per row. A DatasetDict's splits become the
`split` column (its `validation` is dev, as every split name is read: data.tables.SPLIT_ALIASES); a single
Dataset is one table, with whatever `split` column it has. The frame then follows the conventions of a
Parquet table of the same columns (STS, pairs, labelled texts, a text column).
"""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from headstore.data.errors import DataError

DICT_MARKER = "dataset_dict.json"
DATASET_MARKERS = ("dataset_info.json", "state.json")
EXTRA = "pip install 'headstore[hf]' (the Hugging Face datasets library)"


def is_hf_dataset_dir(path: str | Path) -> bool:
    """Whether `path` is a folder `datasets.save_to_disk` wrote."""
    path = Path(path)
    return path.is_dir() and ((path / DICT_MARKER).is_file() or all((path / m).is_file() for m in DATASET_MARKERS))


def _datasets():
    try:
        import datasets  # here: an optional extra, and seconds to import
    except ImportError:
        raise ValueError(f"reading a Hugging Face datasets folder needs the library: {EXTRA}") from None
    return datasets


def _frame(dataset, where: Path) -> pl.DataFrame:
    """One Dataset's rows as a polars frame (its Arrow table, indices applied)."""
    if getattr(dataset, "_indices", None) is not None:
        dataset = dataset.flatten_indices()
    try:
        return pl.from_arrow(dataset.data.table)
    except Exception as err:  # a column polars cannot take (e.g. nested images): say which folder
        raise DataError(where, f"its Arrow table cannot be read as a table ({type(err).__name__}: "
                        f"{str(err).splitlines()[0][:200]})") from None


def read_hf_frame(path: str | Path) -> pl.DataFrame:
    """The rows of a `save_to_disk` folder; a DatasetDict's splits in a `split` column, in its order."""
    path = Path(path)
    datasets = _datasets()
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as err:  # missing/damaged arrow files, a bad state.json: one line naming the folder
        raise DataError(path, f"cannot be read by datasets.load_from_disk ({type(err).__name__}: "
                        f"{(str(err).strip().splitlines() or [''])[0][:200]}) (written completely by "
                        "save_to_disk?)") from None
    if not isinstance(loaded, datasets.DatasetDict):
        return _frame(loaded, path)
    frames = []
    for split, dataset in loaded.items():
        frame = _frame(dataset, path / split)
        if "split" in frame.columns:
            raise DataError(path / split, "has a `split` column and is a split of a DatasetDict: one of the two "
                            "must go (the DatasetDict's splits are the splits)")
        frames.append(frame.with_columns(pl.lit(split, dtype=pl.String).alias("split")))
    if not frames:
        raise DataError(path, f"{DICT_MARKER} lists no splits: nothing to read")
    columns = [f.columns for f in frames]
    if any(c != columns[0] for c in columns):
        raise DataError(path, f"its splits have different columns ({dict(zip(loaded.keys(), columns))}); give "
                        "every split the same columns")
    return pl.concat(frames, how="vertical_relaxed")


def hf_columns(path: str | Path) -> list[str]:
    """Column names of a `save_to_disk` folder from its metadata (no rows read; `split` for a DatasetDict)."""
    path = Path(path)
    if (path / DICT_MARKER).is_file():
        try:
            splits = json.loads((path / DICT_MARKER).read_text())["splits"]
        except (OSError, ValueError, KeyError) as err:
            raise DataError(path / DICT_MARKER, f"not a datasets DatasetDict listing ({err})") from None
        if not splits:
            raise DataError(path, f"{DICT_MARKER} lists no splits: nothing to read")
        return [*hf_columns(path / splits[0]), "split"]
    try:
        features = json.loads((path / "dataset_info.json").read_text()).get("features") or {}
    except (OSError, ValueError) as err:
        raise DataError(path / "dataset_info.json", f"cannot be read ({err})") from None
    return list(features)
