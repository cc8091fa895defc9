"""The one place headstore writes and reads its head artefacts (what `cli train-head`, `cli grid`,
`cli export`, `cli finetune` and `Head.save` leave on disk), and the ranking of a grid's results.

- a head directory: `head.safetensors` (a one-head stack, `heads.network.model.save_heads`), `normalizer.safetensors`,
  `config.json` (head shape, training settings, dataset, store fingerprint and its parts). The weights are
  written last, so a directory whose weights exist is whole (every file atomically, `data.files`).
- a grid's stacks: per stack S (heads trained together; S is the head_id of its first head) under
  `GRID/heads/`: `S.safetensors` (H heads), `S.normalizer.safetensors` (the normaliser they share), `S.json`
  (head shape, each head's training settings and head_id in stack order, array, dataset, store fingerprint);
  `results.parquet` rows name their `stack` and `stack_index`.
- a grid's results: `results.parquet` (every column; `aggregated` false on a row kept from an earlier run but not
  this one's) and `results.csv` (no object columns, no `history`); `ranked_configs` is the one ranking of its
  configurations (the leaderboard's order, `GRID#rank=K`): this run's rows only.
- an ensemble directory: `ensemble.json` (format, members, config) and a head directory per member (`member-1/`, ...).
This module imports nothing above the heads core (data, heads.network.model, heads.network.features, heads.settings.config,
heads.artefacts.judged), so `Head` (heads.artefacts.head) and the experiments read and write through it without cycles.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import polars as pl
import torch

from headstore.data.files import atomic_write_json, atomic_write_parquet, atomic_write_text, read_parquet_or_explain
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.network.features import Normalizer
from headstore.heads.scoring.losses import scoring_energy
from headstore.heads.network.model import StackedMLP, load_heads, save_heads
from headstore.heads.artefacts.judged import JUDGED_FILE

HEAD_FILE, NORMALIZER_FILE, CONFIG_FILE = "head.safetensors", "normalizer.safetensors", "config.json"
RESULTS_FILE, RESULTS_CSV = "results.parquet", "results.csv"
STACK_FORMAT = "headstore.grid-stack/1"  # S.json's format tag
ENSEMBLE_FILE = "ensemble.json"
ENSEMBLE_FORMAT = "headstore.ensemble/1"
ENSEMBLE_ENERGY = "l1"  # the one energy whose mean over heads is the energy of the concatenated outputs
# result columns that are not settings (left out when grouping seeds into configurations)
VARIED_EXCLUDE = {"head_id", "grid_version", "made_of", "aggregated", "stack", "stack_index", "status", "reason", "best_epoch",
                  "train_seconds", "eval_seconds", "primary", "history", "n_labelled", "strength_chosen",
                  "strength_curve"}
# result columns: per split, transfer and selection sets, and the frozen baseline of a stack's own texts
RESULT_PREFIXES = ("dev_", "test_", "ood_", "sel_", "base_")


# --- head directories -------------------------------------------------------------------------------
def _write_whole(weights: Path, normalizer_path: Path, meta: Path, model: StackedMLP, normalizer: Normalizer,
                 info: dict) -> None:
    """Normaliser, then the JSON, then the weights: files whose weights exist have the other two."""
    weights.parent.mkdir(parents=True, exist_ok=True)
    normalizer.save(normalizer_path)
    atomic_write_json(meta, info, sort_keys=True)
    save_heads(weights, model)


def write_head_dir(out: str | Path, model: StackedMLP, normalizer: Normalizer, config: dict) -> Path:
    """Write a head directory (`read_head_dir`, `Head.load`, `cli eval --head` read it); returns it."""
    out = Path(out)
    _write_whole(out / HEAD_FILE, out / NORMALIZER_FILE, out / CONFIG_FILE, model, normalizer, config)
    return out


def read_head_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file (a `cli train-head --out` folder holds config.json "
                                "beside head.safetensors)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        where = f"line {e.lineno}" if isinstance(e, json.JSONDecodeError) else f"byte {e.start}"
        raise ValueError(f"{path}: not valid JSON ({where}: {e.msg if hasattr(e, 'msg') else e.reason}) "
                         "(the head's config is broken; retrain the head)") from None
    missing = [k for k in ("train", "store_manifest") if not isinstance(config, dict) or k not in config]
    if missing:
        raise ValueError(f"{path}: not a head config (missing {', '.join(missing)}) (retrain the head)")
    try:
        TrainConfig.from_dict(config["train"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: its \"train\" settings are not valid: {e} (retrain the head)") from None
    return config


def check_head_config(path: Path, config: dict, weights_cfg: HeadConfig) -> None:
    """config.json's "head" block must be a valid HeadConfig equal to the one the weights were saved with
    (a hand-edited or mismatched config would otherwise describe another model than the one applied)."""
    block = config.get("head")
    if block is None:  # heads saved by `Head.save` of an ensemble member carry it; older configs may not
        return
    try:
        cfg = HeadConfig(**block)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: its \"head\" settings are not valid: {e} (retrain the head)") from None
    if cfg != weights_cfg:
        differ = [f"{k} {getattr(cfg, k)!r} vs {getattr(weights_cfg, k)!r} in {HEAD_FILE}"
                  for k in block if getattr(cfg, k, None) != getattr(weights_cfg, k, None)]
        raise ValueError(f"{path}: its \"head\" settings do not match the weights beside it ({'; '.join(differ)}) "
                         "(the config was edited or belongs to another head; retrain or export the head again)")


def load_safetensors(path: Path, load):
    """load(path), with a damaged file (truncated, not safetensors) reported as the file and its problem."""
    try:
        return load(path)
    except (ValueError, FileNotFoundError):
        raise
    except Exception as e:  # safetensors raises SafetensorError / OSError for a truncated file
        raise ValueError(f"{path}: cannot be read ({type(e).__name__}: {str(e).strip()[:200]}) "
                         "(the file is truncated or damaged; retrain the head)") from None


def read_head_dir(d: str | Path) -> tuple[StackedMLP, Normalizer, dict]:
    """(one-head StackedMLP, Normalizer, config.json's content) of a head directory; a directory without a
    normaliser file (heads saved before there was one) gets the identity normaliser."""
    d = Path(d)
    if (d / RESULTS_FILE).is_file() and not (d / HEAD_FILE).is_file():
        raise ValueError(f"{d} is a `cli grid` output; name one of its heads: '{d}#rank=1' (the dev-selected "
                         f"best) or '{d}#id=<head_id>' (see its results.csv)")
    if (d / CONFIG_FILE).is_file() and not (d / HEAD_FILE).is_file():
        raise FileNotFoundError(f"{d}: {CONFIG_FILE} but no {HEAD_FILE}: an incomplete head directory (its weights "
                                "are written last; writing it stopped before them: train or export the head again) "
                                "or not a head directory (a `cli train-head --out` folder holds both)")
    if not (d / HEAD_FILE).is_file():
        raise FileNotFoundError(f"{d}: no {HEAD_FILE} (is this a `cli train-head --out` directory?)")
    if not (d / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{d}: no {CONFIG_FILE} beside {HEAD_FILE}; the head cannot be applied "
                                "without its settings")
    config = read_head_config(d / CONFIG_FILE)
    model = load_safetensors(d / HEAD_FILE, load_heads)
    check_head_config(d / CONFIG_FILE, config, model.cfg)
    if model.n_heads != 1:
        model = model.head_slice(int(config.get("stack_index", 0)))
    norm_path = d / NORMALIZER_FILE
    norm = load_safetensors(norm_path, Normalizer.load) if norm_path.is_file() \
        else Normalizer.fit("none", torch.zeros(1, 1))
    return model, norm, config


# --- ensemble directories ---------------------------------------------------------------------------
def is_ensemble_dir(d: str | Path) -> bool:
    return (Path(d) / ENSEMBLE_FILE).is_file() and not (Path(d) / HEAD_FILE).is_file()


def write_ensemble_dir(out: str | Path, members: list[tuple[StackedMLP, Normalizer, dict]], config: dict) -> Path:
    """Each member (model, normaliser, config) as a head directory `member-N/`, then `ensemble.json`."""
    out = Path(out)
    names = [f"member-{i}" for i in range(1, len(members) + 1)]
    for name, member in zip(names, members):
        write_head_dir(out / name, *member)
    atomic_write_json(out / ENSEMBLE_FILE, {"format": ENSEMBLE_FORMAT, "members": names, "config": config},
                      sort_keys=True)
    return out


def read_ensemble_dir(d: str | Path) -> tuple[list[Path], dict]:
    """(the member head directories, the ensemble's config) of an ensemble directory."""
    d = Path(d)
    try:
        info = json.loads((d / ENSEMBLE_FILE).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{d / ENSEMBLE_FILE}: not valid JSON ({e}) (the ensemble is damaged; export it again)") from None
    if not isinstance(info, dict) or info.get("format") != ENSEMBLE_FORMAT or not info.get("members"):
        raise ValueError(f"{d / ENSEMBLE_FILE}: not a headstore ensemble (format {ENSEMBLE_FORMAT!r} with members)")
    return [d / name for name in info["members"]], info.get("config", {})


# --- grid results and their ranking ------------------------------------------------------------------
def read_results(grid_dir: str | Path) -> pl.DataFrame:
    """A grid's results.parquet, every row (FileNotFoundError naming the folder when it has none)."""
    path = Path(grid_dir) / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{grid_dir}: no {RESULTS_FILE} (is this a `cli grid --out` directory?)")
    return read_parquet_or_explain(path, "the grid's results are damaged: rerun the grid with --overwrite, or into "
                                         "another --out")


def resume_rows(grid_dir: str | Path, version: int, made_of: str | None = None) -> tuple[list[dict], list[dict]]:
    """(rows of grid format `version` made of `made_of` (the datasets' contents and the recipe, a digest: the
    `made_of` column; None: any), rows of anything else: kept in the file with `aggregated` false, never reused,
    aggregated or ranked, said in one line each); ([], []) for a grid not started."""
    path = Path(grid_dir) / RESULTS_FILE
    if not path.is_file():
        return [], []
    rows = read_results(grid_dir).to_dicts()
    old = [r for r in rows if r.get("grid_version") != version]
    other = [r for r in rows if r.get("grid_version") == version and made_of is not None and r.get("made_of") != made_of]
    if old:
        versions = sorted({str(r.get("grid_version") or 1) for r in old})
        print(f"{path}: {len(old)} row(s) of grid format version {', '.join(versions)} ignored "
              f"(this is version {version}: they are neither resumed from nor aggregated)")
    if other:
        print(f"{path}: {len(other)} row(s) made from other contents of the datasets (an edited --data, --transfer, "
              "--select-ood, --unlabeled or anchor_data file), by another train-head recipe, or by a headstore that "
              "did not record either, ignored: their heads train again")
    stale = {id(r) for r in old + other}
    return [r for r in rows if id(r) not in stale], old + other


def write_results(grid_dir: str | Path, rows: list[dict]) -> pl.DataFrame:
    """results.parquet (every column) and results.csv (no object columns, no history); returns the frame."""
    frame = pl.DataFrame(rows, infer_schema_length=None)
    atomic_write_parquet(Path(grid_dir) / RESULTS_FILE, frame)
    flat = frame.select([c for c in frame.columns if frame[c].dtype != pl.Object and c != "history"])
    atomic_write_text(Path(grid_dir) / RESULTS_CSV, flat.write_csv())
    return frame


def rule_key(dev: float, loss: float | None, delta: float) -> tuple:
    """Sort key (higher is better) of a candidate under heads.training.selection's rule: within delta first, by dev;
    then the rest by least out-of-domain loss. Without out-of-domain sets (loss None) it is the dev metric
    alone. (Here, with the ranking it orders, so that ranking needs nothing above the heads core.)"""
    if loss is None:
        return (1, dev)
    if not math.isfinite(loss):
        return (0, -math.inf)
    return (1, dev) if loss <= delta else (0, -loss)


def ranked_configs(frame: pl.DataFrame) -> tuple[list[pl.DataFrame], list[str]]:
    """The ok heads grouped into configurations (every setting but the seed), best dev mean first.

    The one ranking of a grid: the leaderboard's order and what `GRID#rank=K` refers to. Ties keep
    the order of first appearance; configurations without a dev value come last. A grid run with
    `--select-ood` ranks by the rule of heads.training.selection on the means over seeds: configurations whose
    out-of-domain dev loss is within delta first (by dev), then the rest by least loss."""
    current = [pl.col("aggregated").fill_null(True)] if "aggregated" in frame.columns else []  # not a stale row
    ok = frame.filter(pl.col("status") == "ok", *current)
    settings = [c for c in ok.columns if c not in VARIED_EXCLUDE and not c.startswith(RESULT_PREFIXES)]
    keys = [c for c in settings if c != "seed"]
    if ok.is_empty():
        return [], keys
    groups = [g for _, g in ok.group_by(keys, maintain_order=True)]

    def dev_mean(g: pl.DataFrame) -> float | None:
        if "dev_primary" not in g.columns or g["dev_primary"].null_count() == g.height:
            return None
        return float(g["dev_primary"].drop_nulls().mean())

    means = [dev_mean(g) for g in groups]
    if "sel_loss" in ok.columns and ok["sel_loss"].null_count() < ok.height:
        delta = float(ok["sel_delta"].drop_nulls()[0])
        losses = [float(g["sel_loss"].drop_nulls().mean()) if g["sel_loss"].null_count() < g.height else None
                  for g in groups]
        keys_ = [rule_key(m, loss, delta) if m is not None else (-1, 0.0) for m, loss in zip(means, losses)]
        order = sorted(range(len(groups)), key=lambda i: tuple(-x for x in keys_[i]))
        return [groups[i] for i in order], keys
    order = sorted(range(len(groups)), key=lambda i: (means[i] is None, -(means[i] or 0.0)))
    return [groups[i] for i in order], keys


def ensemble_groups(frame: pl.DataFrame) -> list[pl.DataFrame]:
    """The configurations an ensemble of a grid draws from, best first (the leaderboard's order, dev only):
    those trained with the l1 energy (a loss that ignores the energy is cosine: heads.scoring.losses.scoring_energy) on
    the same store array as the best of them."""
    groups, _ = ranked_configs(frame)
    l1 = [g for g in groups if scoring_energy(g["loss"][0], g["energy"][0]) == ENSEMBLE_ENERGY]
    return [g for g in l1 if g["array"][0] == l1[0]["array"][0]] if l1 else []


def _best_dev(group: pl.DataFrame) -> pl.DataFrame:
    return group.sort("dev_primary", descending=True, nulls_last=True, maintain_order=True)


def ensemble_ids(grid_dir: str | Path, k: int | str, seed: int | None = None) -> list[str]:
    """The head_ids of `GRID#ensemble=K`: of each of the K best l1 configurations (`ensemble_groups`), the
    head of `seed`, or its best-dev seed when seed is None."""
    try:
        k = int(k)
    except (TypeError, ValueError):
        raise ValueError(f"grid reference ensemble={k!r}: give a positive integer, e.g. {grid_dir}#ensemble=3") from None
    groups = ensemble_groups(read_results(grid_dir))
    if not 1 <= k <= len(groups):
        raise ValueError(f"{grid_dir}: ensemble of {k} out of range; the grid has {len(groups)} trained l1 "
                         "configurations on one array")
    ids = []
    for rank, group in enumerate(groups[:k], 1):
        rows = _best_dev(group) if seed is None else group.filter(group["seed"] == seed)
        if rows.is_empty():
            raise ValueError(f"{grid_dir}: configuration of rank {rank} has no head of seed {seed}")
        ids.append(rows["head_id"][0])
    return ids


# --- grid stacks --------------------------------------------------------------------------------------
def stack_paths(out: str | Path, stack: str) -> tuple[Path, Path, Path]:
    d = Path(out) / "heads"
    return d / f"{stack}.safetensors", d / f"{stack}.normalizer.safetensors", d / f"{stack}.json"


def save_stack(out: str | Path, stack: str, model: StackedMLP, norm: Normalizer, head_ids: list[str],
               train_configs: list, array: str, context: dict) -> None:
    """Write one trained stack loadably. `context`: the dataset/store fields of a train-head config.json
    (data, format, task, kind, dev, store, store_fingerprint, store_manifest)."""
    assert model.n_heads == len(head_ids) == len(train_configs)
    info = {"format": STACK_FORMAT, "head": asdict(model.cfg), "array": array, "head_ids": list(head_ids),
            "train": [c.to_dict() for c in train_configs], **context}
    _write_whole(*stack_paths(out, stack), model, norm, info)


def select_row(grid_dir: Path, rank: int | str | None = None, id: str | None = None) -> tuple[dict, int | None]:
    """The results row of the head a grid reference names, and the configuration's rank (None for id=)."""
    frame = read_results(grid_dir)
    if id is not None:
        rows = frame.filter(pl.col("head_id") == id)
        if rows.is_empty():
            raise ValueError(f"{grid_dir}: no head with id {id!r}; head ids are in {grid_dir / RESULTS_CSV}")
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
        group = _best_dev(group)
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
    if (grid_dir / JUDGED_FILE).is_file():  # the grid's training judgements: its heads' evals split seen / unseen
        config["judged"] = {"file": JUDGED_FILE}
    return model, load_safetensors(normalizer, Normalizer.load), config
