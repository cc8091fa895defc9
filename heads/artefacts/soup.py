"""Weight averaging (`cli grid --soup K`, `GRID#soup=K`; issue 20, lever 4; model soups, Wortsman et al. 2022).

A soup is one head whose every parameter is the mean of the same parameter of K heads that share their
starting point: the heads' outputs are not averaged (that is an ensemble, heads.artefacts.head.EnsembleHead) but
their weights, so the soup costs what one head costs and exports as one head.

Sharing the start is a condition, not a hope: the members must have the same shape, input array,
normaliser and energy, and equal starting weights (checked on the weights their seeds draw,
heads.network.model.start_of). A linear residual head starts at zero whatever its seed, so its seeds soup; a
deeper head's hidden layers start from its seed's draw, so only heads of one seed (neighbouring
configurations: lr, weight decay, epochs, anchor weight...) share it.

`GRID#soup=K`: the best-dev head of the grid's best configuration (`GRID#rank=1`) and the K - 1 best-dev
heads that share its start (`soup_ids`); `--soup K` scores it per seed (the seed's best-dev head and the
K - 1 best sharing its start), so it gets a mean and CI over seeds like any configuration.
"""
from __future__ import annotations

from pathlib import Path

import polars as pl
import torch

from headstore.heads.artefacts.files import _best_dev, load_grid_head, read_results, select_row
from headstore.heads.network.features import Normalizer
from headstore.heads.network.model import StackedMLP, start_of

# what must be equal for two heads to start from the same weights, besides the seed
# (`sides`: a query-side head's weights map queries only; averaged with a head of both sides they would mean neither)
START_KEYS = ("depth", "hidden", "out_dim", "activation", "dropout", "layer_norm", "residual", "init", "mix_init",
              "mix_mode", "array", "normalize", "energy", "sides")


def seed_free_start(row: dict) -> bool:
    """True when the starting weights do not depend on the seed: a linear residual head (zero) or an
    identity-initialised linear head (W = I)."""
    return row["depth"] == 1 and (bool(row["residual"]) or row.get("init") == "identity")


def soup_ids(grid_dir: str | Path, k: int | str, seed: int | None = None) -> list[str]:
    """The head ids of the soup of K (module doc), the best first."""
    try:
        k = int(k)
    except (TypeError, ValueError):
        raise ValueError(f"grid reference soup={k!r}: give a positive integer, e.g. {grid_dir}#soup=3") from None
    frame = read_results(grid_dir).filter(pl.col("status") == "ok")
    if seed is None:
        first, _ = select_row(Path(grid_dir), rank=1)
    else:
        rows = _best_dev(frame.filter(pl.col("seed") == seed))
        if rows.is_empty():
            raise ValueError(f"{grid_dir}: no trained head of seed {seed}")
        first = rows.row(0, named=True)
    keys = [c for c in START_KEYS if c in frame.columns] + ([] if seed_free_start(first) else ["seed"])
    same = frame.filter(pl.all_horizontal([pl.col(c).eq_missing(first[c]) for c in keys]))
    same = _best_dev(same.filter(pl.col("head_id") != first["head_id"]))
    ids = [first["head_id"]] + same["head_id"].to_list()[:k - 1]
    if k < 1 or k > len(ids):
        raise ValueError(f"{grid_dir}: a soup of {k} needs {k} heads sharing the start of {first['head_id']}; "
                         f"the grid has {len(ids)} (same shape, array, normaliser, energy"
                         f"{'' if seed_free_start(first) else ' and seed: a deeper head starts from its seed'})")
    return ids


def _same_normalizer(a: Normalizer, b: Normalizer) -> bool:
    return (a.kind == b.kind and a.blocks == b.blocks and torch.equal(torch.as_tensor(a.center), torch.as_tensor(b.center))
            and torch.equal(torch.as_tensor(a.scale), torch.as_tensor(b.scale)))


def soup_of(models: list[StackedMLP]) -> StackedMLP:
    """One head whose parameters are the mean of the one-head stacks' (which must share their start)."""
    if not models:
        raise ValueError("a soup needs at least one head")
    first = models[0]
    start = dict(start_of(first).named_parameters())
    for m in models[1:]:
        if m.cfg != first.cfg or m.n_heads != 1:
            raise ValueError(f"soup members must be one head of one shape: {m.cfg} vs {first.cfg}")
        if any(not torch.equal(p, start[n]) for n, p in start_of(m).named_parameters()):
            raise ValueError("soup members must share their starting weights (heads.artefacts.soup: a deeper head starts "
                             "from its seed's draw; soup heads of one seed, or linear residual heads)")
    out = StackedMLP(1, first.cfg, seeds=first.seeds)
    with torch.no_grad():
        for name, p in out.named_parameters():
            p.copy_(torch.stack([m.get_parameter(name) for m in models]).mean(0))
    return out


def load_soup(grid_dir: str | Path, k: int | str, seed: int | None = None):
    """(model, normaliser, config) of the soup of K of a grid (`GRID#soup=K`)."""
    ids = soup_ids(grid_dir, k, seed)
    loaded = [load_grid_head(grid_dir, id=i) for i in ids]
    norm = loaded[0][1]
    if any(not _same_normalizer(norm, n) for _, n, _ in loaded[1:]):
        raise ValueError(f"{grid_dir}: the soup's heads were fitted with different normalisers")
    config = dict(loaded[0][2])
    config["soup"] = {"grid": str(grid_dir), "k": len(ids), "head_ids": ids, "seed": seed,
                      "rule": "the best-dev head of the best configuration (of the seed) and the K - 1 best-dev "
                              "heads sharing its start; weights averaged"}
    return soup_of([m for m, _, _ in loaded]), norm, config
