"""A second pooling of the taps (issue 57, "mean, and one more pooling if dev says so"): max-pooled taps beside the
store's mean-pooled ones, decided on STS-B dev with the product's own `cli train-head`. Outside the product.

    cache  the tap store's texts (row order) through the product's featurize pass (featurize.run.windows.
           encode_in_plan_order: the store's settings, plan, autocast and hooks); each tap's (B, S, D) hooked states,
           kept by a spy around featurize.encoder.taps.recording, are max-pooled over the same tokens as the mean
           (featurize.encoder.pooling.max_pool under pooling_mask: padding and a left-out prompt excluded). The
           pass's own mean taps are compared with the store's (the alignment: the largest gap per tap).
    copy   a COPY of the store with one more array per tap, `tapmax_<kind>_<i>` ({"tap": "max_<kind>"}: select-taps
           takes it as a candidate; `cli store verify` checks it), written with the product's array layout.
    select select-taps' group lasso over the mean and max taps at another SGD step (--lr).
    train  `cli train-head` on the copy per candidate and seed (dev only printed; a rerun reuses finished runs).
    table  test and SemEval (without STS-B's sentences) of two candidates, paired two-level CIs of the difference.

    python3 bench/studies/taps_maxpool.py cache --store S --out W/cache
    python3 bench/studies/taps_maxpool.py copy --store S --cache W/cache --out W/store-max
    python3 bench/studies/taps_maxpool.py select --store W/store-max --data D --lr 0.01 --out W/runs/sel-meanmax-lr0.01.json
    python3 bench/studies/taps_maxpool.py train --store W/store-max --data D --work W/runs --candidates K --seeds 0,1,2
    python3 bench/studies/taps_maxpool.py table --store W/store-max --data D --semeval E --work W/runs \\
        --candidates CHOSEN,COMPARATOR --json OUT
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from headstore.featurize.encoder import pooling
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.encoder.resolved import resolve
from headstore.featurize.encoder.taps import tap_arrays
from headstore.featurize.run.windows import encode_in_plan_order, open_encoder
from headstore.featurize.store.layout import MANIFEST
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.writer import create_array, write_manifest
from headstore.heads.scoring.bootstrap import two_level_ci
from taps_study import RESIDUAL, eval_pairs, run_cli, scored

MAX_PREFIX = "tapmax_"
MEAN4 = ["tap_mlp_2", "tap_mlp_3", "tap_attn_6", "tap_mlp_6"]  # select-taps' top four (docs/taps.md)
RECIPE = [*RESIDUAL, "--array-dropout", "0.3", "--lr", "3e-4"]  # the study's winning head
CANDIDATES = {  # key -> (label, --array or "select:FILE:K" (features + the K best of a select-taps JSON), options)
    "mean4": ("features + 4 mean taps (the study's head)", "+".join(["features", *MEAN4]), RECIPE),
    "mean4-max4": ("features + 4 mean + the same 4 max taps",
                   "+".join(["features", *MEAN4, *(t.replace("tap_", MAX_PREFIX) for t in MEAN4)]), RECIPE),
    "max4": ("features + the 4 taps max-pooled instead",
             "+".join(["features", *(t.replace("tap_", MAX_PREFIX) for t in MEAN4)]), RECIPE),
    "mean4-max2": ("features + 4 mean taps + the 2 max taps select-taps ranks first (attn 6, block 6)",
                   "+".join(["features", *MEAN4, "tapmax_attn_6", "tapmax_block_6"]), RECIPE),
    # select-taps over the 35 mean and max candidates at lr 0.01: its default 0.1 diverges there (group norms ~100)
    "sel-meanmax-4": ("features + select-taps' top 4 of mean and max taps", "select:sel-meanmax-lr0.01.json:4", RECIPE),
    "sel-meanmax-6": ("features + select-taps' top 6 of mean and max taps", "select:sel-meanmax-lr0.01.json:6", RECIPE),
}


@contextlib.contextmanager
def keeping_tap_states():
    """The product's hooks, spied on: yields a dict whose "last" is the last forward pass's {(kind, layer): (B, S, D)}."""
    kept, original = {}, pooling.recording

    @contextlib.contextmanager
    def spy(model, taps):
        with original(model, taps) as got:
            kept["last"] = got
            yield got
    pooling.recording = spy
    try:
        yield kept
    finally:
        pooling.recording = original


def cache(a) -> None:
    store, out = FeatureStore.open(a.store), Path(a.out)
    config = json.loads((Path(a.store) / "config.json").read_text())
    config["layers"] = tuple(config["layers"])
    settings = resolve(FeaturizeConfig(**config))
    texts = store.texts.sort("row")
    texts = texts.head(a.limit) if a.limit else texts
    ids, strings = texts["text_id"].to_list(), texts["text"].to_list()
    taps = tap_arrays(settings.taps)
    n = len(strings)
    maxed = {name: np.zeros((n, t["dim"]), np.float16) for name, t in taps.items()}
    means = {name: np.zeros((n, t["dim"]), np.float16) for name, t in taps.items()}
    encoder, _ = open_encoder(settings)
    t0 = time.perf_counter()
    with keeping_tap_states() as kept, torch.inference_mode():
        for idx, feats, _tok, batch in encode_in_plan_order(settings, encoder, ids, strings, ""):
            mask = batch.attention_mask if batch.attention_mask is not None else torch.ones_like(batch.input_ids)
            mask = pooling.pooling_mask(mask, None)  # the store has no prompts (asserted below)
            for name, t in taps.items():
                maxed[name][idx] = pooling.max_pool(kept["last"][(t["tap"], t["layer"])], mask).numpy()
                means[name][idx] = feats[name]
    seconds = time.perf_counter() - t0
    assert not any(store.prompts.values()), "a store with prompts: give pooling_mask the prompt lengths"
    out.mkdir(parents=True, exist_ok=True)
    gaps = {}
    for name in taps:
        np.save(out / f"{MAX_PREFIX}{name.removeprefix('tap_')}.npy", maxed[name])
        ref = store.features(np.arange(n), name)  # rows 0..n-1: the store's row order
        diff = np.abs(means[name].astype(np.float32) - ref)
        mine = means[name].astype(np.float32)
        cosine = (mine * ref).sum(1) / np.linalg.norm(mine, axis=1) / np.linalg.norm(ref, axis=1)
        gaps[name] = {"max_abs": float(diff.max()), "max_abs_over_row_max": float(
                          (diff.max(1) / np.abs(ref).max(1)).max()), "min_row_cosine": float(cosine.min()),
                      "equal_fraction": float((diff == 0).mean()), "max_over_mean_ok": bool(
                          (maxed[name].astype(np.float32) >= ref - 2e-2 * np.maximum(np.abs(ref), 1)).all())}
    info = {"store": str(Path(a.store).resolve()), "n_texts": n, "encode_seconds": round(seconds, 1),
            "load_after": os.getloadavg(), "mean_taps_vs_store": gaps,
            "bytes_per_text_max_taps": int(sum(t["dim"] for t in taps.values()) * 2)}
    (out / "info.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1))


def copy(a) -> None:
    src, dst, cached = Path(a.store), Path(a.out), Path(a.cache)
    if dst.exists():
        raise SystemExit(f"{dst}: exists; remove it first")
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    manifest = json.loads((dst / MANIFEST).read_text())
    n = int(manifest["n_texts"])
    for name, info in list(manifest["arrays"].items()):
        if "tap" not in info:
            continue
        new = name.replace("tap_", MAX_PREFIX)
        values = np.load(cached / f"{new}.npy")
        assert values.shape == (n, info["dim"]), (new, values.shape)
        arr = create_array(dst / f"{new}.zarr", info["dim"], manifest["dtype"], manifest["chunk_rows"],
                           manifest["shard_rows"])
        arr.resize((n, info["dim"]))
        arr[:] = values
        manifest["arrays"][new] = {"path": f"{new}.zarr", "tap": f"max_{info['tap']}", "layer": info["layer"],
                                   "dim": info["dim"], "pooling": "max"}
    write_manifest(dst, manifest)
    print(f"{dst}: {len(manifest['arrays'])} arrays")


def select(a) -> None:
    """heads.experiments.taps.selection.select_taps (what `cli select-taps` runs) at another --lr."""
    from headstore.heads.experiments.taps.selection import select_taps, selection_table
    from headstore.heads.settings.taps import TapSelectConfig
    print(selection_table(select_taps(a.store, a.data, TapSelectConfig(lr=a.lr, keep=8), out=a.out)))


def array_of(spec: str, work: Path) -> str:
    if not spec.startswith("select:"):
        return spec
    _, file, k = spec.split(":")
    sel = json.loads((work / file).read_text())
    ranked = [t for t in sel["ranking"] if sel["scores"][t] > 0][:int(k)]
    order = list(sel["scores"])  # the store's order
    return "+".join([sel["first"], *sorted(ranked, key=order.index)])


def train(a) -> list[dict]:
    work, records = Path(a.work), []
    for key in a.candidates.split(","):
        _label, spec, options = CANDIDATES[key]
        array = array_of(spec, work)
        for seed in [int(s) for s in a.seeds.split(",")]:
            folder = work / f"{key}-s{seed}"
            record = folder / "run.json"
            if not record.is_file():
                folder.mkdir(parents=True, exist_ok=True)
                load0, started = os.getloadavg()[0], time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
                seconds = run_cli(["train-head", "--store", a.store, "--data", a.data, "--array", array, "--seed",
                                   str(seed), "--out", str(folder / "head"), "--overwrite", *options],
                                  folder / "train.log")
                metrics = json.loads((folder / "head" / "metrics.json").read_text())
                config = json.loads((folder / "head" / "config.json").read_text())
                record.write_text(json.dumps({
                    "name": key, "seed": seed, "array": array, "options": options, "started": started,
                    "load_before": load0, "load_after": os.getloadavg()[0], "cli_seconds": round(seconds, 1),
                    "train_seconds": config.get("train_seconds"),
                    "dev": metrics["dev"]["head"]["spearman_manhattan"]}, indent=1))
            records.append(json.loads(record.read_text()))
            r = records[-1]
            print(f"{key:<16} seed {seed}  dev {r['dev']:.4f}  ({r['cli_seconds']} s, load {r['load_before']:.1f})")
    return records


def table(a) -> None:
    names = a.candidates.split(",")
    records = [json.loads((Path(a.work) / f"{k}-s{s}" / "run.json").read_text())
               for k in names for s in a.seeds.split(",")]
    store = FeatureStore.open(a.store)
    sets = eval_pairs(store, a.data, a.semeval)
    gold = {s: np.asarray(p.labels, np.float64) for s, p in sets.items()}
    values = scored(a, records, store, sets)  # (name, split) -> (seeds, pairs) of -E
    rows, ref = [], names[-1]
    for key in names:
        mine = [r for r in records if r["name"] == key]
        row = {"name": key, "label": CANDIDATES[key][0], "array": mine[0]["array"], "options": mine[0]["options"],
               "dev": float(np.mean([r["dev"] for r in mine])), "dev_per_seed": [r["dev"] for r in mine],
               "train_seconds_per_seed": [r["train_seconds"] for r in mine]}
        for s in sets:
            v = values[key, s]
            row[f"{s}_per_seed"] = [float(spearmanr(x, gold[s]).statistic) for x in v]
            row[s] = float(np.mean(row[f"{s}_per_seed"]))
            row[f"{s}_ci"] = two_level_ci(v, 1000, 0, gold=gold[s], statistic="spearman")
            if key != ref:
                row[f"{s}_minus_{ref}_ci"] = two_level_ci(v, 1000, 0, gold=gold[s], statistic="spearman",
                                                          minus=values[ref, s])
        rows.append(row)
    dev_only = [json.loads(f.read_text()) for key in (a.dev_candidates or "").split(",") if key
                for f in sorted(Path(a.work).glob(f"{key}-s*/run.json"))]
    out = {"command": " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load": os.getloadavg(), "rows": rows, "dev_runs": dev_only,
           "selections": {f.name: json.loads(f.read_text()) for f in sorted(Path(a.work).glob("sel-*.json"))},
           "cache": json.loads((Path(a.cache) / "info.json").read_text()) if a.cache else None}
    Path(a.json).write_text(json.dumps(out, indent=1))
    for r in rows:
        print(f"{r['label']}: dev {r['dev']:.4f} {r['dev_per_seed']} test {r['test']:.4f} {r['test_ci']} "
              f"{r.get(f'test_minus_{ref}_ci', '')} semeval {r['semeval']:.4f} {r.get(f'semeval_minus_{ref}_ci', '')}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=["cache", "copy", "select", "train", "table"])
    p.add_argument("--store", required=True)
    p.add_argument("--out")
    p.add_argument("--cache")
    p.add_argument("--data")
    p.add_argument("--semeval")
    p.add_argument("--work")
    p.add_argument("--candidates", default="mean4,mean4-max4")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--dev-candidates", default="", help="table: every candidate tried (their dev runs in the JSON)")
    p.add_argument("--json")
    p.add_argument("--lr", type=float, default=0.1, help="select: select-taps' SGD step")
    p.add_argument("--limit", type=int, default=0, help="cache: the first LIMIT rows only (a smoke run)")
    a = p.parse_args()
    {"cache": cache, "copy": copy, "select": select, "train": train, "table": table}[a.step](a)


if __name__ == "__main__":
    main()
