"""Every head of a `cli grid` output, loadable: what the grid saves per stack and how one head is found.

Per stack S (heads trained together; S is the head_id of its first head) under `GRID/heads/`:
- `S.safetensors`: the stack's parameters (H heads, `heads.model.save_heads`);
- `S.normalizer.safetensors`: the normaliser all its heads share (fitted once on the training texts);
- `S.json`: the head shape, each head's training settings and head_id in stack order, the array, the
  dataset and the store fingerprint; `results.parquet` rows name their `stack` and `stack_index`.

`GRID#rank=K` is the K-th configuration of the leaderboard (ranked by mean dev metric over seeds,
`report.ranked_configs`) and, within it, the seed with the best dev metric: selection on dev only.
`GRID#id=HEAD_ID` is one head by its id (results.csv lists them).
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import polars as pl

from headstore.data.files import atomic_write_json
from headstore.heads.features import Normalizer
from headstore.heads.model import load_heads, save_heads
from headstore.heads.head import load_safetensors

STACK_FORMAT = "headstore.grid-stack/1"  # S.json's format tag


def stack_paths(out: Path, stack: str) -> tuple[Path, Path, Path]:
    d = Path(out) / "heads"
    return d / f"{stack}.safetensors", d / f"{stack}.normalizer.safetensors", d / f"{stack}.json"


def save_stack(out: Path, stack: str, model, norm: Normalizer, head_ids: list[str], train_configs: list,
               array: str, context: dict) -> None:
    """Write one trained stack loadably. `context`: the dataset/store fields of a train-head config.json
    (data, format, task, kind, dev, store, store_fingerprint, store_manifest)."""
    weights, normalizer, meta = stack_paths(out, stack)
    weights.parent.mkdir(parents=True, exist_ok=True)
    assert model.n_heads == len(head_ids) == len(train_configs)
    norm.save(normalizer)
    atomic_write_json(meta, {"format": STACK_FORMAT, "head": asdict(model.cfg), "array": array,
                             "head_ids": list(head_ids), "train": [c.to_dict() for c in train_configs],
                             **context}, sort_keys=True)
    save_heads(weights, model)  # last: a stack whose weights exist has its normaliser and config


def _results(grid_dir: Path) -> pl.DataFrame:
    path = grid_dir / "results.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{grid_dir}: no results.parquet (is this a `cli grid --out` directory?)")
    return pl.read_parquet(path)


def select_row(grid_dir: Path, rank: int | str | None = None, id: str | None = None) -> tuple[dict, int | None]:
    """The results row of the head a grid reference names, and the configuration's rank (None for id=)."""
    from headstore.heads.experiments.report import ranked_configs

    frame = _results(grid_dir)
    if id is not None:
        rows = frame.filter(pl.col("head_id") == id)
        if rows.is_empty():
            raise ValueError(f"{grid_dir}: no head with id {id!r}; head ids are in {grid_dir / 'results.csv'}")
        row = rows.row(0, named=True)
        if row["status"] != "ok":
            raise ValueError(f"{grid_dir}: head {id} was not trained ({row['status']}: {row['reason']})")
        return row, None
    try:
        k = int(rank)
    except (TypeError, ValueError):
        raise ValueError(f"grid reference rank={rank!r}: give a positive integer, e.g. {grid_dir}#rank=1") from None
    groups, _ = ranked_configs(frame)
    if not 1 <= k <= len(groups):
        raise ValueError(f"{grid_dir}: rank {k} out of range; the grid has {len(groups)} trained configurations")
    group = groups[k - 1]
    if "dev_primary" in group.columns and group["dev_primary"].null_count() < group.height:
        group = group.sort("dev_primary", descending=True, nulls_last=True, maintain_order=True)
    return group.row(0, named=True), k


def load_grid_head(grid_dir: str | Path, rank: int | str | None = None, id: str | None = None):
    """(one-head StackedMLP, Normalizer, config dict in train-head's config.json shape) of a grid head."""
    grid_dir = Path(grid_dir)
    row, k = select_row(grid_dir, rank, id)
    stack, index = row.get("stack"), row.get("stack_index")
    weights, normalizer, meta = stack_paths(grid_dir, stack) if stack else (None, None, None)
    if index is None or meta is None or not meta.is_file() or not weights.is_file():
        raise ValueError(f"{grid_dir}: head {row['head_id']} was saved without its normaliser, config or index "
                         "(a grid output from before heads were loadable); rerun the grid into a new --out")
    try:
        info = json.loads(meta.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{meta}: not valid JSON ({e}) (the grid output is damaged; rerun the grid into a "
                         "new --out)") from None
    if info["head_ids"][index] != row["head_id"]:
        raise ValueError(f"{meta}: stack index {index} holds head {info['head_ids'][index]}, "
                         f"results.parquet says {row['head_id']}; the grid output is inconsistent")
    model = load_safetensors(weights, load_heads).head_slice(int(index))
    selection = {"dir": str(grid_dir), "head_id": row["head_id"], "rank": k, "stack": stack, "stack_index": index,
                 **{c: row[c] for c in ("primary", "dev_primary", "test_primary") if c in row}}
    config = {k_: v for k_, v in info.items() if k_ not in ("format", "head_ids", "train")}
    config.update(train=info["train"][index], grid=selection)
    return model, load_safetensors(normalizer, Normalizer.load), config
