"""A grid file and the ids of its heads.

Grid file: a `[grid]` table of lists (every combination is trained) and an optional `[fixed]` table of
single values; `[[grids]]` (an array of such tables) adds further products. Keys are HeadConfig fields
(depth, hidden, out_dim, activation, dropout, layer_norm, residual, init), TrainConfig settings (loss,
energy, lr, weight_decay, epochs, mined_k, seed, shots, ...) and `array` (the store array: another layer or
pooling; `features+features_layer-4` for a head that mixes several layers).

A head's id hashes every setting with its default resolved (an unset `q` is hashed as the Q it stands for,
so retuning a default retrains), the dataset, its score range, the store fingerprint and GRID_VERSION;
rows of another grid format version are kept in results.parquet but never resumed from nor aggregated.
"""
from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import asdict, fields
from pathlib import Path

from sklearn.model_selection import ParameterGrid

from headstore.data.tables import read_utf8
from headstore.heads.settings.config import HeadConfig, TrainConfig, check_types
from headstore.heads.settings.train_sections import PRECISIONS
from headstore.heads.kinds.base import DEV_FRACTION, DEV_SEED
from headstore.heads.kinds.ranking import IR_TOPK
from headstore.heads.network.model import MASK_RULE
from headstore.heads.scoring.losses import GENUINE_THRESHOLD
from headstore.heads.training.anchor import ANCHOR_SAMPLE
from headstore.heads.training.selection import DEFAULT_DELTA

HEAD_KEYS = tuple(f.name for f in fields(HeadConfig) if f.name not in ("in_dim", "mix"))  # both set from the array
TRAIN_KEYS = TrainConfig.keys()
GRID_KEYS = HEAD_KEYS + TRAIN_KEYS + ("array",)
# bump when training/evaluation changes so old results are not reused. 2: dev carved by text, trec_eval
# ties and all-zero queries, positives-only pairs as retrieval, resolved defaults in the head id
GRID_VERSION = 2
# settings added after grid ids were first recorded, with their default (left out of the id when at it)
UNSET_SINCE_ID = {"strength": "1", "anchor_weight": 0.0, "anchor_data": "", "exact_max": 20_000, "pool_k": 100,
                  "sides": "both", "remine_every": 1, "label_smoothing": 0.1, "solver": "adamw", "self_train": 0,
                  "self_train_add": 64, "self_train_c": 10.0, "mix_mode": "scalar", "array_dropout": 0.0,
                  "array_widths": None, "eval_every": 0}


def _check_values(path: str, where: str, key: str, values: list) -> None:
    """Each value of one grid key must have the type of the setting it is for."""
    cls = HeadConfig if key in HEAD_KEYS else TrainConfig if key in TRAIN_KEYS else None
    for value in values:
        if cls is not None:
            check_types(cls, {key: value}, where=f"{path}: {where} ")
        elif not isinstance(value, str):  # array: a store array name
            raise ValueError(f"{path}: {where} {key} must be a string (a store array name), got {value!r}")


def read_grid(path: str, precision: str | None = None) -> list[dict]:
    """Every combination of the grid file's settings, as flat dicts (unknown keys are an error).
    `precision` (`cli grid --precision`): every head's, where the file leaves it unset or sets the same.

    `[grid]` holds lists whose product is trained (sklearn's ParameterGrid); `[[grids]]` (an array of such
    tables) adds further products, e.g. one per loss where settings only apply to some losses; `[fixed]`
    single values apply to all. Duplicate combinations are trained once. Every value is checked (type,
    valid loss, lr > 0, ...) here, before anything trains, and an error names the file and the table."""
    try:
        spec = tomllib.loads(read_utf8(Path(path)))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML: {e}") from None
    unknown = sorted(set(spec) - {"grid", "grids", "fixed"})
    if unknown:
        raise ValueError(f"{path}: unknown tables {unknown}; valid: ['fixed', 'grid', 'grids']")
    fixed = spec.get("fixed", {})
    grids = ([spec["grid"]] if "grid" in spec else []) + list(spec.get("grids", []))
    if precision is not None:
        fixed = {**fixed, "precision": _one_precision(path, precision, fixed, grids)}
    if not grids:
        raise ValueError(f"{path}: no [grid] or [[grids]] table (list the settings to vary, e.g. lr = [1e-3, 3e-3])")
    combos: list[dict] = []
    for n, grid in enumerate(grids):
        where = "[grid]" if n == 0 and "grid" in spec else f"[[grids]] #{n + 1 - ('grid' in spec)}"
        if not isinstance(grid, dict) or not grid:
            raise ValueError(f"{path}: {where} is empty (list at least one setting to vary, e.g. lr = [1e-3, 3e-3])")
        for table, name in ((grid, where), (fixed, "[fixed]")):
            bad = sorted(set(table) - set(GRID_KEYS))
            if bad:
                raise ValueError(f"{path}: {name} has unknown settings {bad}; valid: {sorted(GRID_KEYS)}")
        both = sorted(set(grid) & set(fixed))
        if both:
            raise ValueError(f"{path}: {', '.join(both)} in both {where} and [fixed] (the [fixed] value would be "
                             "dropped); give each setting in one table")
        for k, v in grid.items():
            if not isinstance(v, list) or not v:
                raise ValueError(f"{path}: {where} {k} must be a non-empty list of values, got {v!r}")
            _check_values(path, where, k, v)
        for k, v in fixed.items():
            _check_values(path, "[fixed]", k, [v])
        for combo in ParameterGrid(grid):
            c = {**fixed, **combo}
            try:
                split_settings(c)  # the value checks of HeadConfig / TrainConfig
            except ValueError as e:
                raise ValueError(f"{path}: {where}: {e}") from None
            if c not in combos:
                combos.append(c)
    return combos


def _one_precision(path: str, precision: str, fixed: dict, grids: list) -> str:
    """--precision where the grid file does not say otherwise; a file that sweeps or fixes another is an error."""
    if precision not in PRECISIONS:
        raise ValueError(f"--precision {precision!r}; valid: {list(PRECISIONS)}")
    if any(isinstance(g, dict) and "precision" in g for g in grids):
        raise ValueError(f"--precision {precision}: {path} sweeps precision in its grid; drop one of the two")
    if fixed.get("precision", precision) != precision:
        raise ValueError(f"--precision {precision}: {path} fixes precision = {fixed['precision']!r}; drop one of "
                         "the two")
    return precision


def split_settings(s: dict) -> tuple[HeadConfig, TrainConfig, str]:
    head = HeadConfig(**{k: v for k, v in s.items() if k in HEAD_KEYS})
    train = TrainConfig(**{k: v for k, v in s.items() if k in TRAIN_KEYS})
    return head, train, s.get("array", "features")


def resolved_settings(settings: dict, in_dim: int | None = None) -> dict:
    """Every number a head's training depends on, defaults resolved: the head's shape (out_dim None ->
    in_dim), the training settings, the loss constants under its energy (Q, tau, margin, CoSENT's
    lambda) and the module constants that shape the data (dev slice, genuine threshold, ranking depth)."""
    head, train, array = split_settings(settings)
    head_dict = {k: v for k, v in asdict(head).items() if UNSET_SINCE_ID.get(k, object()) != v}
    if in_dim:
        head_dict.update(in_dim=in_dim, out_dim=HeadConfig(**{**head_dict, "in_dim": in_dim}).out_features)
    loss = train.loss_config().resolved(train.eval_energy)
    train_dict = {**train.to_dict(), **{k: loss[k] for k in ("q", "tau", "margin")}}  # None -> the default used
    if train_dict["precision"] == "fp32":  # fp32 heads keep the ids they had before `precision` existed
        del train_dict["precision"]
    for key, unset in UNSET_SINCE_ID.items():  # settings added since: at their default, ids do not move
        if key in train_dict and train_dict[key] == unset:
            del train_dict[key]
    return {"head": head_dict, "train": train_dict, "array": array, "loss": loss,
            "constants": {"dev_fraction": DEV_FRACTION, "dev_seed": DEV_SEED, "genuine_threshold": GENUINE_THRESHOLD,
                          "ir_topk": IR_TOPK}}


def head_id(settings: dict, data: str, fingerprint: str, transfer: tuple[str, ...] = (), *,
            in_dim: int | None = None, score_range=None, select_ood: tuple[str, ...] = (),
            ood_delta: float = DEFAULT_DELTA, data_format: str | None = None, unlabeled: str | None = None) -> str:
    """The id of a grid head: a hash of every setting (defaults resolved), the dataset (`data`: its contents'
    digest, data.keys.content_digest, so the same file under another path is the same head) and how it is read,
    the store, the out-of-domain sets and GRID_VERSION. Parts that are unset are left out, so ids of grids
    that did not use them stay as they were. An anchored head's id holds the rule its anchor sample was drawn by
    (heads.training.anchor.ANCHOR_SAMPLE: the task's own texts, never another dataset of the store, so a grown
    store trains nothing again; heads anchored under the old whole-store rule are not reused); a head with dropout,
    the rule its masks are drawn by (heads.network.model.MASK_RULE: heads of unseeded masks are not reused). `unlabeled`: the
    digest of the --unlabeled texts (heads.kinds.unlabeled), which change the corpus, the impostors and the
    anchor's sample."""
    selection = {"select_ood": sorted(select_ood), "ood_delta": ood_delta} if select_ood else {}
    fmt = {"format": data_format} if data_format is not None else {}
    anchor = {"anchor_sample": ANCHOR_SAMPLE} if settings.get("anchor_weight") else {}
    masks = {"mask_rule": MASK_RULE} if settings.get("dropout") or settings.get("array_dropout") else {}
    blob = json.dumps({**resolved_settings(settings, in_dim), "data": data, "store": fingerprint,
                       "score_range": list(score_range) if score_range else None,
                       "version": GRID_VERSION, "transfer": sorted(transfer), **selection, **fmt, **anchor, **masks,
                       **({"unlabeled": unlabeled} if unlabeled else {})},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
