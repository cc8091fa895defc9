"""`cli grid`: train every combination of a TOML grid of head settings, stacked by shape.

Grid file: a `[grid]` table of lists (every combination is trained) and an optional `[fixed]` table of
single values. Keys are HeadConfig fields (depth, hidden, out_dim, activation, dropout, layer_norm,
residual, init), TrainConfig fields (loss, energy, lr, weight_decay, epochs, mined_k, seed, ...) and
`array` (the store array: another layer or pooling; `features+features_layer-4` for a head that mixes
several layers). Heads that share everything but lr, weight decay
and seed train together in one stack (one batched pass per step for all of them).

Combinations that cannot apply to the dataset (a loss that needs graded labels on IR pairs) are
recorded with status `skipped` and the reason, never silently dropped. Results are written after
every stack, so a rerun of the same grid into the same output skips finished heads and a changed grid
trains only what is new. A head's id hashes every setting with its default resolved (an unset `q` is
hashed as the Q it stands for, so retuning a default retrains), the dataset, its score range, the store
fingerprint and GRID_VERSION; rows of another grid format version are kept in results.parquet but never
resumed from nor aggregated.
"""
from __future__ import annotations

import hashlib
import json
import time
import tomllib
from dataclasses import asdict, fields
from pathlib import Path

import polars as pl
import torch
from sklearn.model_selection import ParameterGrid
from tqdm.auto import tqdm

from headstore.data.files import atomic_write_json, atomic_write_text
from headstore.data.outputs import prepare_output_dir
from headstore.data.tables import read_utf8
from headstore.featurize.store import FeatureStore
from headstore.heads.artefacts import resume_rows, save_stack, write_results
from headstore.heads.config import TrainConfig, check_types, stack_key
from headstore.heads.evaluate import IR_TOPK, PREFIX, evaluate_split, embed_rows, primary_metric
from headstore.heads.features import array_list, load_features
from headstore.heads.losses import LOSS_KINDS
from headstore.heads.model import HeadConfig
from headstore.heads.experiments.report import write_report
from headstore.heads.selection import DEFAULT_DELTA, load_selection
from headstore.heads.tasks import DEV_FRACTION, DEV_SEED, WHOLE, Task, load_task, task_rows, without_overlap
from headstore.heads.run import head_shape
from headstore.heads.train import GENUINE_THRESHOLD, train_stack

HEAD_KEYS = tuple(f.name for f in fields(HeadConfig) if f.name not in ("in_dim", "mix"))  # both set from the array
TRAIN_KEYS = tuple(f.name for f in fields(TrainConfig))
GRID_KEYS = HEAD_KEYS + TRAIN_KEYS + ("array",)
# bump when training/evaluation changes so old results are not reused. 2: dev carved by text, trec_eval
# ties and all-zero queries, positives-only pairs as retrieval, resolved defaults in the head id
GRID_VERSION = 2


def _check_values(path: str, where: str, key: str, values: list) -> None:
    """Each value of one grid key must have the type of the setting it is for."""
    cls = HeadConfig if key in HEAD_KEYS else TrainConfig if key in TRAIN_KEYS else None
    for value in values:
        if cls is not None:
            check_types(cls, {key: value}, where=f"{path}: {where} ")
        elif not isinstance(value, str):  # array: a store array name
            raise ValueError(f"{path}: {where} {key} must be a string (a store array name), got {value!r}")


def read_grid(path: str) -> list[dict]:
    """Every combination of the grid file's settings, as flat dicts (unknown keys are an error).

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


def split_settings(s: dict) -> tuple[HeadConfig, TrainConfig, str]:
    head = HeadConfig(**{k: v for k, v in s.items() if k in HEAD_KEYS})
    train = TrainConfig(**{k: v for k, v in s.items() if k in TRAIN_KEYS})
    return head, train, s.get("array", "features")


def resolved_settings(settings: dict, in_dim: int | None = None) -> dict:
    """Every number a head's training depends on, defaults resolved: the head's shape (out_dim None ->
    in_dim), the training settings, the loss constants under its energy (Q, tau, margin, CoSENT's
    lambda) and the module constants that shape the data (dev slice, genuine threshold, ranking depth)."""
    head, train, array = split_settings(settings)
    head_dict = asdict(head)
    if in_dim:
        head_dict.update(in_dim=in_dim, out_dim=HeadConfig(**{**head_dict, "in_dim": in_dim}).out_features)
    loss = train.loss_config().resolved(train.eval_energy)
    train_dict = {**asdict(train), **{k: loss[k] for k in ("q", "tau", "margin")}}  # None -> the default used
    if train_dict["precision"] == "fp32":  # fp32 heads keep the ids they had before `precision` existed
        del train_dict["precision"]
    return {"head": head_dict, "train": train_dict, "array": array, "loss": loss,
            "constants": {"dev_fraction": DEV_FRACTION, "dev_seed": DEV_SEED, "genuine_threshold": GENUINE_THRESHOLD,
                          "ir_topk": IR_TOPK}}


def head_id(settings: dict, data: str, fingerprint: str, transfer: tuple[str, ...] = (), *,
            in_dim: int | None = None, score_range=None, select_ood: tuple[str, ...] = (),
            ood_delta: float = DEFAULT_DELTA) -> str:
    selection = {"select_ood": sorted(select_ood), "ood_delta": ood_delta} if select_ood else {}
    blob = json.dumps({**resolved_settings(settings, in_dim), "data": data, "store": fingerprint,
                       "score_range": list(score_range) if score_range else None,
                       "version": GRID_VERSION, "transfer": sorted(transfer), **selection}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def not_applicable(task: Task, train: TrainConfig) -> str:
    kind = LOSS_KINDS[train.loss]
    if kind.labels == "required" and (task.train is None or task.train.labels is None):
        return f"loss {train.loss} needs graded or labelled pairs; {task.name} has positives only"
    return ""


def transfer_split(task: Task) -> str:
    """The split an out-of-domain dataset is scored on: test, else the whole table, else its first split."""
    return next((s for s in ("test", WHOLE) if s in task.eval_sets), next(iter(task.eval_sets)))


def run_grid(store_path: str, data_path: str, grid_path: str, out_dir: str, data_format: str | None = None,
             progress: bool = True, transfer: tuple[str, ...] = (), score_range=None,
             overwrite: bool = False, select_ood: tuple[str, ...] = (), ood_delta: float = DEFAULT_DELTA,
             ensembles: tuple[int, ...] = ()) -> pl.DataFrame:
    """Train every head of the grid (skipping finished ones); write results, leaderboard and plots.

    `transfer`: out-of-domain datasets (texts in the store) every head is also scored on, never
    trained or selected on: columns `ood_<name>_primary` (and the frozen baseline's in baseline.json);
    a transfer table without a split column is scored whole.
    `score_range`: the scale of an STS table's scores (default: detected).
    `select_ood`: out-of-domain datasets whose dev (else train) split takes part in selection, epochs and
    configurations alike (heads.selection; `ood_delta` its tolerance); columns `sel_<name>_primary`, `sel_loss`.
    `ensembles`: sizes K of ensembles of the best configurations to score per seed (heads.experiments.ensembles)."""
    combos = read_grid(grid_path)
    inputs = (data_path, grid_path, *transfer, *select_ood)
    prepare_output_dir(out_dir, "grid", overwrite, resumable=True, inputs=inputs, create=False)
    store = FeatureStore.open(store_path)
    missing = sorted({a for c in combos for a in array_list(c.get("array", "features"))} - set(store.arrays))
    if missing:
        raise ValueError(f"{grid_path}: array {missing} not in {store_path}; its arrays: {store.arrays}")
    task = load_task(data_path, store, data_format, score_range=score_range)
    ood = {t.name: t for t in (load_task(p, store, for_eval=True) for p in transfer)}
    in_domain = task_rows(task)
    for name in list(ood):  # an out-of-domain set never scores texts the head was trained or selected on
        ood[name], dropped = without_overlap(ood[name], in_domain)
        if any(dropped.values()):
            print(f"{name}: dropped items sharing a text with {task.name}: {dropped}")
    selection = load_selection(store, select_ood, task, load_features(store, "features"), ood_delta)
    out = prepare_output_dir(out_dir, "grid", overwrite, resumable=True, inputs=inputs)  # data read: claim it
    atomic_write_text(out / "grid.toml", read_utf8(Path(grid_path)))
    rows, old_rows = resume_rows(out, GRID_VERSION)
    done = {r["head_id"] for r in rows}
    todo = []
    for s in combos:
        hid = head_id(s, str(data_path), store.fingerprint, tuple(ood), in_dim=store.dim,
                      score_range=task.score_range, select_ood=tuple(selection.sets), ood_delta=ood_delta)
        if hid in done:
            continue
        head, train, array = split_settings(s)
        reason = not_applicable(task, train)
        if reason:
            rows.append({"head_id": hid, "grid_version": GRID_VERSION, **_flat(head, train, array),
                         "status": "skipped", "reason": reason})
            done.add(hid)
            continue
        todo.append((hid, head, train, array))
    groups: dict[tuple, list] = {}
    for item in todo:
        _, head, train, array = item
        groups.setdefault((json.dumps(asdict(head), sort_keys=True), stack_key(train), array), []).append(item)
    features_cache: dict[str, torch.Tensor] = {}
    baselines: dict[str, dict] = {}
    bar = tqdm(total=len(todo), desc="grid heads", disable=not progress)
    for (_, _, array), items in groups.items():
        if array not in features_cache:
            features_cache[array] = load_features(store, array)
            baselines[array] = _baseline(task, features_cache[array][:, :store.dim], ood)  # the first array
        X = features_cache[array]
        head_cfg = head_shape(items[0][1], X, array)
        configs = [it[2] for it in items]
        t0 = time.perf_counter()
        model, norm, runs = train_stack(task, X, head_cfg, configs, progress=progress, selection=selection)
        energy = configs[0].eval_energy
        Xn = norm(X)
        metrics = {}
        for split in ("dev", "test"):
            if split in task.eval_sets:
                metrics[split] = evaluate_split(task, split, lambda r: embed_rows(model, Xn, r), (energy,))
        for name, t in ood.items():
            metrics[f"ood_{name}"] = evaluate_split(t, transfer_split(t), lambda r: embed_rows(model, Xn, r), (energy,))
        sel_loss, sel_sets = selection.losses(lambda r: embed_rows(model, Xn, r), energy) if selection else (None, {})
        group_id = items[0][0]
        save_stack(out, group_id, model, norm, [it[0] for it in items], configs, array,
                   stack_context(task, store, store_path, data_path, data_format))
        for h, (hid, head, train, _) in enumerate(items):
            run = runs[h]
            row = {"head_id": hid, "grid_version": GRID_VERSION, "stack": group_id, "stack_index": h,
                   **_flat(head, train, array), "status": run.status,
                   "reason": run.reason, "best_epoch": run.best_epoch,
                   "train_seconds": (time.perf_counter() - t0) / len(items),
                   "primary": primary_metric(task.kind, energy), "history": json.dumps(run.history)}
            for split, (per_head, per_item) in metrics.items():
                kind = ood[split[4:]].kind if split.startswith("ood_") else task.kind
                row.update({f"{split}_{k}": v for k, v in per_head[h].items()})
                row[f"{split}_primary"] = per_head[h][primary_metric(kind, energy)]
                row[f"{split}_items"] = json.dumps([float(x) for x in per_item[h][PREFIX[energy]]])
            if selection:
                row.update({f"sel_{n}_primary": float(v[h]) for n, v in sel_sets.items()})
                row["sel_loss"], row["sel_delta"] = float(sel_loss[h]), float(ood_delta)
            rows.append(row)
        write_results(out, old_rows + rows)
        bar.update(len(items))
    bar.close()
    if rows or old_rows:
        write_results(out, old_rows + rows)
    frame = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()
    if not baselines:
        X = load_features(store, "features")
        baselines["features"] = _baseline(task, X, ood)
    if selection:
        for b in baselines.values():
            b["selection"] = selection.describe()
    atomic_write_json(out / "baseline.json", baselines)
    ens_rows = []
    if ensembles and not frame.is_empty():
        arrays = {a: features_cache.get(a) if a in features_cache else load_features(store, a)
                  for a in frame.filter(pl.col("status") == "ok")["array"].unique().to_list()}
        from headstore.heads.experiments.ensembles import score_ensembles, write_ensembles

        ens_rows, per_seed = score_ensembles(out, frame, task, arrays, ood, selection, tuple(ensembles), transfer_split)
        write_ensembles(out, ens_rows, per_seed)
    write_report(frame, task, baselines, out, print_it=progress, ensembles=ens_rows)
    return frame


def stack_context(task: Task, store: FeatureStore, store_path: str, data_path: str, data_format: str | None) -> dict:
    """What a head needs to know of its dataset and store (train-head's config.json fields), saved per stack."""
    return {"data": str(data_path), "format": data_format, "task": task.name, "kind": task.kind,
            "dev": task.dev_note or "the dataset's dev split", "store": str(store_path),
            "store_fingerprint": store.fingerprint,
            "store_manifest": {k: v for k, v in store.manifest.items() if k != "arrays"}}


def _flat(head: HeadConfig, train: TrainConfig, array: str) -> dict:
    h = {k: v for k, v in asdict(head).items() if k != "in_dim"}
    return {**h, **asdict(train), "array": array}


def _baseline(task: Task, X: torch.Tensor, ood: dict[str, Task] | None = None) -> dict:
    """Frozen features with cosine and L1: metrics and per-item values on dev and test (and OOD sets)."""
    out = {}
    for name, t in (ood or {}).items():
        res, _ = evaluate_split(t, transfer_split(t), lambda r: embed_rows(None, X, r), ("cosine", "l1"))
        out[f"ood_{name}"] = {"metrics": res[0]}
    for split in ("dev", "test"):
        if split in task.eval_sets:
            res, items = evaluate_split(task, split, lambda r: embed_rows(None, X, r), ("cosine", "l1"))
            out[split] = {"metrics": res[0], "items": {k: [float(x) for x in v] for k, v in items[0].items()}}
    return out
