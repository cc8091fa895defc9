"""What the kinds built from a table of pairs share (STS tables, labelled pairs, positives-only pairs):
splits (dev carved by text when the table has none), pairs as store rows, and scoring a split's pairs.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import polars as pl
import torch

from headstore.heads.scoring.energy import ENERGIES
from headstore.heads.kinds.base import PREFIX, WHOLE, PairSet, carve_dev, store_rows

COLUMNS = {"sts": ("sentence1", "sentence2"), "pairs": ("anchor", "positive")}  # dataset kind -> pair columns


def table_splits(ds, for_eval: bool, by_anchor: bool = False) -> tuple[pl.DataFrame, str]:
    """The table with the splits to use and a note on how dev was made: scored whole as split `all` when
    evaluating a table that has no dev/test split; dev carved by text from train when training without one (by
    the anchor's text alone with `by_anchor`: positive pairs ranking a shared corpus, whose documents dev and test
    share with train as a BEIR folder's do, heads.kinds.ir.from_beir)."""
    frame = ds.frame
    a_col, b_col = COLUMNS[ds.kind]
    splits = set(frame["split"].unique().to_list())
    if for_eval and splits == {"train"}:  # no split column (or train only): score the whole table
        frame = frame.with_columns(pl.lit(WHOLE).alias("split"))
        return frame, f"the table has no dev/test split: all {frame.height} rows are scored as split {WHOLE!r}"
    if not for_eval and "train" not in splits:
        raise ValueError(f"{ds.path}: no train split to train on (splits found: {', '.join(sorted(splits))})")
    if not for_eval and "dev" not in splits and by_anchor:
        frame, note = _carve_table_dev(frame, [a_col])  # pairs sharing an anchor text held out together
        note = note.replace("held out by text", "held out by anchor text").replace(
            "no dev text appears in a train pair", "no dev anchor is a train anchor")
        return frame, note + "; documents are the shared corpus (positives and unlabeled texts), as for test"
    if not for_eval and "dev" not in splits:
        return _carve_table_dev(frame, [a_col, b_col, "negative"])
    return frame, ""


def _carve_table_dev(frame: pl.DataFrame, text_columns: list[str]) -> tuple[pl.DataFrame, str]:
    """The frame with a dev split carved by text (of `text_columns`) from its train rows (see carve_dev)."""
    is_train = (frame["split"] == "train").to_numpy()
    train_idx = np.flatnonzero(is_train)
    cols = [c for c in text_columns if c in frame.columns]
    values = [frame[c].to_list() for c in cols]
    items = [[v[i] for v in values if v[i] is not None] for i in train_idx]
    is_dev, dropped, note = carve_dev(items, "pairs")
    split = frame["split"].to_numpy().astype(object)
    split[train_idx[is_dev]] = "dev"
    split[train_idx[dropped]] = None
    frame = frame.with_columns(pl.Series("split", split.tolist(), dtype=pl.String))
    return frame.filter(pl.col("split").is_not_null()), note


def split_frames(frame: pl.DataFrame):
    """(split name, its rows) for every split of the table, in sorted order."""
    for split in sorted(set(frame["split"].unique().to_list())):
        yield split, frame.filter(pl.col("split") == split)


def pair_set(store, ds, f: pl.DataFrame, where: str, labels: np.ndarray | None) -> PairSet:
    """The pairs of table rows `f` as store rows (given negatives too when every row has one)."""
    a_col, b_col = COLUMNS[ds.kind]
    a = store_rows(store, f[a_col].to_list(), where, ds.role_of(a_col))  # query-document pairs: query anchors
    b = store_rows(store, f[b_col].to_list(), where, ds.role_of(b_col))
    neg = None
    if "negative" in f.columns and f["negative"].null_count() == 0:
        neg = store_rows(store, f["negative"].to_list(), where, ds.role_of("negative"))[:, None]
    return PairSet(a, b, labels, neg)


PairMetrics = Callable[[PairSet, np.ndarray, str], dict]  # (pairs, energies (P,), prefix) -> metrics


def evaluate_pairs(data: PairSet, embed, energies: tuple[str, ...], metrics_of: PairMetrics,
                   nan_metrics: Callable[[tuple[str, ...]], dict]) -> tuple[list[dict], list[dict]]:
    """Metrics of every head on a split's pairs: the energy of each pair under each energy, scored by
    `metrics_of`; per-item values are the predictions -E (for the kind's bootstrap CI). A head whose outputs are
    not all finite scores `nan_metrics`. Each energy is one pass over every head (a head's row of it holds the
    numbers a pass over that head alone gives), and the outputs are searched for a non-finite value only in the
    heads whose energies are not all finite (a NaN or inf output makes its pair's energy one)."""
    za, zb = embed(data.anchor, "query"), embed(data.positive, "document")  # (H, P, d)
    per_energy = {e: ENERGIES[e](za, zb).double().cpu().numpy() for e in energies}  # (H, P) each
    results, items = [], []
    for h in range(za.shape[0]):
        if not all(np.isfinite(v[h]).all() for v in per_energy.values()) and not _finite(za[h], zb[h]):
            results.append(nan_metrics(energies))
            items.append({PREFIX[e]: np.full(len(data), np.nan) for e in energies})
            continue
        m, it = {}, {}
        for energy, values in per_energy.items():
            e = values[h]  # (P,)
            m.update(metrics_of(data, e, PREFIX[energy]))
            it[PREFIX[energy]] = -e
        results.append(m)
        items.append(it)
    return results, items


def _finite(za: torch.Tensor, zb: torch.Tensor) -> bool:
    return bool(torch.isfinite(za).all() and torch.isfinite(zb).all())
