"""A head's training judgements, kept in its folder so any later scoring can split its figures into seen and
unseen queries (heads.kinds.seen): `cli eval` of the head on the same dataset, another one, or a transfer set.

`judgements.parquet` (JUDGED_FILE) holds one row per judged pair of the training run: `query_id` and
`document_id`, the store's text ids of its two texts (each under the prompt of its role, so they are found in
any store of the same features), `label` (null for positive pairs, the label or rescaled score otherwise) and
`split` ("train": trained on; "dev": selected on, its relevant judgements). Every relevant document of either
counts as judged when the head is evaluated (heads.kinds.seen). config.json's "judged" says which file it is
and how many pairs of each split and relevant documents it holds. A head folder without it
(trained before the record, or copied without it) has no judgements to split on: said, not guessed.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from headstore.data.files import atomic_write_parquet, read_parquet_or_explain
from headstore.heads.kinds import PairSet
from headstore.heads.kinds.seen import judged_documents

JUDGED_FILE = "judgements.parquet"
RELEVANT = 0.5  # a labelled pair above this label is a relevant judgement (as heads.kinds.pairs' `relevant`)
SCHEMA = {"query_id": pl.String, "document_id": pl.String, "label": pl.Float64, "split": pl.String}


def text_ids_of_rows(store, rows: np.ndarray) -> list[str]:
    """The store's text id of each row (one scan of the text_id and row columns)."""
    wanted = np.unique(rows)
    frame = (store.scan_texts(["text_id", "row"]).filter(pl.col("row").is_in(wanted.tolist())).collect())
    id_of = dict(zip(frame["row"].to_list(), frame["text_id"].to_list()))
    return [id_of[int(r)] for r in rows]


def write_judgements(out: Path, store, pairs: dict[str, PairSet], earlier: pl.DataFrame | None = None) -> dict:
    """Write `out`/JUDGED_FILE from the training run's judgements ({split: pairs of store rows},
    heads.kinds.judgement_pairs); config.json's "judged" entry ({} where there are none). `earlier`: the record
    of the head the run starts from (cli finetune: `read_record` of its source head), kept beside the run's own
    judgements, a pair in both once."""
    frames = []
    for split, train in pairs.items():
        ids = text_ids_of_rows(store, np.concatenate([train.anchor, train.positive]))
        n = len(train)
        labels = [None] * n if train.labels is None else np.asarray(train.labels, dtype=np.float64).tolist()
        frames.append(pl.DataFrame({"query_id": ids[:n], "document_id": ids[n:], "label": labels, "split": split},
                                   schema=SCHEMA))
    if earlier is not None:
        split = [] if "split" in earlier.columns else [pl.lit(None, dtype=pl.String).alias("split")]  # an old record
        earlier = earlier.with_columns(*split).select(list(SCHEMA)).cast(SCHEMA)
        frames = [pl.concat([earlier, *frames]).unique(maintain_order=True)]
    if not frames:
        return {}
    frame = pl.concat(frames)
    atomic_write_parquet(Path(out) / JUDGED_FILE, frame)
    relevant = frame.filter(pl.col("label").is_null() | (pl.col("label") > RELEVANT))
    return {"file": JUDGED_FILE, "pairs": dict(frame.group_by("split", maintain_order=True).len().iter_rows()),
            "documents": int(relevant["document_id"].n_unique())}


def record_dir(head_ref: str | Path) -> Path:
    """The folder holding a head's record: the head folder, or a grid's for `GRID#rank=K` and the like."""
    ref = Path(head_ref)
    base, sep, _ = str(head_ref).rpartition("#")
    return Path(base) if sep and not ref.exists() else ref


def copy_judgements(head_ref: str | Path, config: dict, out: Path) -> None:
    """Put a head's record beside its copy in `out` (Head.save: an index's head, an export), where it has one."""
    entry = config.get("judged")
    source = record_dir(head_ref) / entry["file"] if entry else None
    if source is not None and source.is_file() and source.resolve() != (Path(out) / entry["file"]).resolve():
        atomic_write_parquet(Path(out) / entry["file"], pl.read_parquet(source))


def read_record(head_ref: str | Path, config: dict) -> tuple[pl.DataFrame | None, str]:
    """(a head's JUDGED_FILE as a frame, ""); (None, why) where the head keeps no record: config.json without
    "judged", or its file not beside it (a head copied or saved without it)."""
    entry = config.get("judged")
    if not entry:
        return None, (f"{head_ref} keeps no training judgements (a head trained before they were recorded)")
    path = record_dir(head_ref) / entry["file"]
    if not path.is_file():
        return None, (f"{path}: missing, though {head_ref}'s config.json names it (a head copied or saved without "
                      "its judgements)")
    frame = read_parquet_or_explain(path, "the head folder is damaged: train the head again")
    if not set(SCHEMA) - {"split"} <= set(frame.columns):
        raise ValueError(f"{path}: columns {frame.columns}, not a head's judgements (query_id, document_id, label); "
                         "the head folder is damaged: train the head again")
    return frame, ""


def read_judged(head_ref: str | Path, config: dict, store) -> tuple[frozenset[int] | None, str]:
    """(the store rows, in `store`, of the documents a head's training judged relevant, "") ; (None, why) where
    the head keeps no record (`read_record`). A judged document absent from `store` is no row of its corpora."""
    frame, why = read_record(head_ref, config)
    if frame is None:
        return None, why
    relevant = frame.filter(pl.col("label").is_null() | (pl.col("label") > RELEVANT))["document_id"]
    rows = store.find_rows(relevant.unique().to_list())
    return judged_documents(rows[rows >= 0]), ""
