"""`cli select-taps`: which of a store's taps (featurize --taps) a head should read, chosen on the training pairs
alone by a group lasso (heads.training.tap_select), before any head is trained on a wide input."""
from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from headstore.data.files import atomic_write_json
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.kinds import load_task
from headstore.heads.settings.taps import TapSelectConfig
from headstore.heads.training.tap_select import check_fit, chosen_spec, group_scores, pair_targets


def candidate_taps(store: FeatureStore, first: str) -> list[str]:
    """The store's tap arrays, less the one that holds the first array's numbers (the last block's output is
    `features` before the model's Normalize); StoreError-like ValueError for a store without taps."""
    arrays = store.manifest["arrays"]
    taps = [name for name, info in arrays.items() if "tap" in info]
    if not taps:
        raise ValueError(f"{store.path}: no taps (featurize it with --taps)")
    first_info = arrays.get(first)
    if first_info is None:
        raise ValueError(f"{store.path}: no array {first!r}; its arrays: {', '.join(store.arrays)} (--first)")
    if "tap" not in first_info and first_info.get("layer") == -1:
        last = max(info["layer"] for info in arrays.values() if info.get("tap") == "block")
        taps = [t for t in taps if not (arrays[t]["tap"] == "block" and arrays[t]["layer"] == last)]
    return [t for t in taps if t != first]


def select_taps(store_path: str, data_path: str, cfg: TapSelectConfig, first: str = "features",
                data_format: str | None = None, out: str | None = None) -> dict:
    """Score every candidate tap on `data_path`'s training pairs; the `--array` spec of the first array and the
    `cfg.keep` best taps. Writes `out` (JSON) when given."""
    t0 = time.perf_counter()
    store = FeatureStore.open(store_path)
    names = candidate_taps(store, first)
    task = load_task(data_path, store, data_format)
    train = task.train
    anchor, partner, target = pair_targets(train.anchor, train.positive, train.labels, cfg.seed)
    rows = np.unique(np.concatenate([anchor, partner]))  # only the training texts are read
    blocks = [store.features(rows, name) for name in names]
    scores, fit = group_scores(blocks, np.searchsorted(rows, anchor), np.searchsorted(rows, partner), target, cfg)
    check_fit(scores, fit, cfg.lr)
    spec = chosen_spec(first, names, scores, cfg.keep)
    widths = {name: int(store.manifest["arrays"][name].get("dim", store.dim)) for name in spec.split("+")}
    itemsize = np.dtype(store.manifest["dtype"]).itemsize
    result = {"store": str(store_path), "data": str(data_path), "first": first, "settings": asdict(cfg),
              "n_pairs": int(len(target)), "train_pearson_by_epoch": fit, "scores": dict(zip(names, map(float, scores))),
              "ranking": [names[i] for i in np.argsort(-scores, kind="stable")], "array": spec,
              "input_width": sum(widths.values()), "bytes_per_text_read": sum(widths.values()) * itemsize,
              "seconds": round(time.perf_counter() - t0, 1)}
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out, result)
    return result


def selection_table(result: dict) -> str:
    """The ranking on the terminal: tap, group norm, chosen."""
    chosen = set(result["array"].split("+"))
    lines = [f"{'tap':<16} {'group norm':>10}  chosen"]
    lines += [f"{name:<16} {result['scores'][name]:>10.4f}  {'*' if name in chosen else ''}"
              for name in result["ranking"]]
    fit = ", ".join(f"{v:.3f}" for v in result["train_pearson_by_epoch"])
    lines.append(f"--array {result['array']}  ({result['input_width']:,} wide; {result['seconds']} s; the training "
                 f"pairs' Pearson by epoch {fit})")
    return "\n".join(lines)
