"""`cli compare`: every way to use the encoder, on the same data, over seeds, with confidence intervals.

The setups (the registries of `heads.experiments.compare.setups`): the frozen encoder's own cosine; frozen
encoder -> stored features -> head; MLM-adapted encoder + head; adapters + head, LoRA + head and the encoder
fine-tuned end to end + head (`cli finetune` from that seed's frozen + head); each tuned encoder also without
a head. Every setup runs at each of `seeds` (a seed sets the head's init and batch order and each tuning
run's seed); each is evaluated on the in-domain test split and on each out-of-domain dataset, with the
seconds and peak memory it cost, its trainable parameters and, optionally, the MLM loss on held-out text
(forgetting). `heads.experiments.compare.report` turns the per-query / per-pair values into mean +- std over
seeds, bootstrap CIs and each setup's paired difference from frozen + head.

Each step writes `OUT/<step>-<key>/` where key hashes what made it (data/keys.py's rule): the resolved value
of every setting that step depends on (including its inputs' keys and its seed), its recipe version and a digest
of the contents of each dataset and model it reads (never a path), and records `step.json` (settings, seconds, peak memory, result) when it
finishes: a rerun (or a run after an interruption) reuses every finished step, and a changed setting reruns
only what depends on it; an edited dataset or a changed default reruns every step it feeds, and a dataset that
is gone is a one-line error. A step folder of an older headstore (no recipe version in its key) is never reused:
said in one line, its steps run again. A finetune step killed mid-run goes on from its last finished epoch (the checkpoint
`cli finetune` keeps in the step's folder), its step.json's seconds those of all its processes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path

from headstore.data.files import atomic_write_json
from headstore.data.keys import content_digest, contents, recipe, resolved
from headstore.featurize.tuning.settle import settled
from headstore.heads.experiments.compare.config import CompareConfig, device_key, on_device
from headstore.heads.experiments.compare.config import load_compare_config, split_list  # noqa: F401
from headstore.heads.experiments.compare.report import DATA  # what a missing dataset's error names
from headstore.heads.experiments.compare.setups import SETUPS, TUNED, Builder, model_key
from headstore.heads.experiments.compare.datasets_root import missing_mlm_text_note


def _key(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _reset_peak_memory() -> bool:
    """Linux: reset the process's peak resident memory (VmHWM), so a step reads its own peak after it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_memory_mb() -> float | None:
    """The process's peak resident memory in MB since the last reset (None where /proc does not say)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class Steps:
    """Runs named steps once per settings key; `run(name, settings, fn, made_by)` -> (dir, result); `made_by`:
    the step's recipe (data/keys.py RECIPES), whose version the key holds and `recipes` keeps by step name.

    Each step's record holds its seconds and the process's peak resident memory while it ran (MB; None
    off Linux), kept in `seconds` and `peak_mb` by step name, also for steps reused from a record.
    `key_of(path)` is the key of the step that made `path`: what a step using it puts in its own key."""

    def __init__(self, out: Path, log=print):
        self.out, self.log = out, log
        self.seconds: dict[str, float] = {}
        self.peak_mb: dict[str, float | None] = {}
        self.results: dict[str, dict] = {}
        self.dirs: dict[str, Path] = {}
        self.keys: dict[Path, str] = {}  # step folder -> its key
        self.recipes: dict[str, str] = {}  # step name -> the recipe version that made it
        older = sorted(p.parent.name for p in out.glob("*/step.json") if "recipe" not in _settings_of(p))
        if older:
            log(f"[compare] {out}: {len(older)} step folder(s) of an older headstore (no recipe version in their "
                f"key, e.g. {older[0]}) are not reused: their steps run again")

    def key_of(self, path) -> str | None:
        """The key of the step whose folder holds `path`; None for a path no step of this run made."""
        path = Path(path).resolve()
        return next((key for folder, key in self.keys.items() if folder == path or folder in path.parents), None)

    def register(self, path, key: str) -> None:
        """`path` (a folder a step's result names, outside OUT too: a given base store) is made by key `key`."""
        self.keys[Path(path).resolve()] = key

    def run(self, name: str, settings: dict, fn, made_by: str) -> tuple[Path, dict]:
        settings = {**settings, "recipe": recipe(made_by)}
        key = _key(settings)
        folder = self.out / f"{name}-{key}"
        record = folder / "step.json"
        if record.is_file():
            done = json.loads(record.read_text())
            self.log(f"[compare] {name}: reusing {folder} ({done['seconds']:.0f} s when it ran)")
        else:
            self.log(f"[compare] {name}: running -> {folder}")
            folder.mkdir(parents=True, exist_ok=True)
            measured = _reset_peak_memory()
            t0 = time.perf_counter()
            result = fn(folder)
            done = {"name": name, "key": key, "settings": settings, "seconds": time.perf_counter() - t0
                    + _earlier_seconds(result),
                    "peak_mb": _peak_memory_mb() if measured else None, "result": result}
            atomic_write_json(record, done, indent=1)
        self.seconds[name], self.dirs[name] = float(done["seconds"]), folder
        self.register(folder, key)
        self.recipes[name] = settings["recipe"]
        self.peak_mb[name], self.results[name] = done.get("peak_mb"), done["result"]
        return folder, done["result"]


def _settings_of(record: Path) -> dict:
    try:
        return json.loads(record.read_text()).get("settings") or {}
    except (OSError, ValueError):
        return {}


def _earlier_seconds(result) -> float:
    """Seconds that killed earlier processes spent on the work a step's run resumed (a result's
    `earlier_seconds`: cli finetune's), counted in the step's: its cost whatever the kills."""
    return float(result.get("earlier_seconds") or 0.0) if isinstance(result, dict) else 0.0


def _featurize(steps: Steps, name: str, cfg: CompareConfig, model: str, parent_key: dict,
               store: str | None = None) -> tuple[Path, dict]:
    from headstore.featurize.run.local import featurize

    fcfg = dataclasses.replace(cfg.featurize, model=model)
    datasets = [cfg.in_domain, *cfg.out_of_domain]
    settings = {"encoder": parent_key, "featurize": _without_model(fcfg), "data": contents(datasets, DATA),
                "store": "given" if store else "own"}  # a given store's features: those the settings make (checked)

    def go(folder: Path) -> dict:
        summary = featurize(fcfg, datasets, store or folder / "store")
        return {"store": str(store or folder / "store"), "fingerprint": summary["fingerprint"],
                "n_encoded": summary["n_encoded"]}

    folder, result = steps.run(name, settings, go, "featurize")
    where = Path(store) if store else folder / "store"  # a given store where it is now, not where a record says
    steps.register(where, steps.keys[folder.resolve()])
    return where, settings



def _without_model(config) -> dict:
    """A config's resolved settings less its `model` (a path: the key names the encoder by what made it)."""
    return {k: v for k, v in resolved(config).items() if k != "model"}



def _train_head(steps: Steps, name: str, cfg: CompareConfig, store: Path, store_key: dict,
                seed: int) -> tuple[Path, dict]:
    from headstore.heads.training.run import train_head

    train = cfg.train.replace(seed=seed)
    settings = {"store": store_key, "head": resolved(cfg.head), "train": resolved(train),
                "data": content_digest(cfg.in_domain, DATA), **device_key(cfg)}
    # the step's own folder (overwrite): a rerun after a crash replaces its half-made head
    folder, _ = steps.run(name, settings, lambda d: _first_metric(
        train_head(str(store), cfg.in_domain, str(d / "head"), cfg.head, train, progress=True,
                   overwrite=True, device=cfg.device)), "train-head")
    return folder / "head", settings


def _first_metric(metrics: dict) -> dict:
    return {"primary": metrics["primary"], "test": metrics.get("head", {}).get(metrics["primary"])}


def _adapt_settings(cfg: CompareConfig):
    return dataclasses.replace(cfg.adapt, model=cfg.model,
                               holdout_fraction=cfg.mlm_holdout_fraction if cfg.mlm else cfg.adapt.holdout_fraction)


def _probe(cfg: CompareConfig, steps: Steps) -> tuple[Path, dict]:
    """The probe MLM head: trained on the frozen base encoder (head only). It scores the MLM loss of every
    encoder without a head of its own, and the MLM adaptation starts from it."""
    from headstore.featurize.tuning.adapt import adapt

    probe_cfg = dataclasses.replace(_adapt_settings(cfg), train_encoder=False,
                                    max_steps=cfg.mlm_probe_steps or cfg.adapt.max_steps)
    key = {"adapt": _without_model(probe_cfg), "model": model_key(cfg.model),
           "data": content_digest(cfg.in_domain, DATA)}
    folder, _ = steps.run("mlm-probe", key, lambda d: _adapt_result(adapt(probe_cfg, [cfg.in_domain], d / "model")),
                          "adapt")
    return folder / "model", key


def _adapt_step(cfg: CompareConfig, steps: Steps, probe_key: dict):
    """fn(name, probe dir, seed) -> (adapted model dir, its key): MLM adaptation from the probe's head."""
    from headstore.featurize.tuning.adapt import adapt

    def run(name: str, probe: Path, seed: int):
        adapt_cfg = dataclasses.replace(_adapt_settings(cfg), model=str(probe), seed=seed)
        key = {"adapt": _without_model(adapt_cfg), "probe": probe_key, "data": content_digest(cfg.in_domain, DATA)}
        folder, _ = steps.run(name, key, lambda d: _adapt_result(adapt(adapt_cfg, [cfg.in_domain], d / "model")),
                              "adapt")
        return folder / "model", key
    return run


def run_compare(cfg: CompareConfig, out_dir: str, log=print) -> str:
    """Run (or reuse) every step at every seed, evaluate every setup; write compare.json, compare.md and
    compare.png; return the terminal table."""
    from headstore.featurize.encoder.model import pick_device, resolve_model
    from headstore.heads.experiments.compare.report import evaluate_built, mlm_losses
    from headstore.heads.experiments.compare.table import write_report

    if cfg.device != "auto":
        pick_device(cfg.device)  # cuda where there is none: said now, not after the first steps ran
    cfg = on_device(cfg)  # every part's device (featurize, adapt, finetune settings) before anything is keyed
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "config.json", asdict(cfg), indent=1)
    missing = missing_mlm_text_note(cfg.mlm, cfg.mlm_text)
    if missing:  # said before the long run and again under the table, never dropped silently
        log(f"[compare] WARNING: {missing}")
    cfg = _subsampled(cfg, out)
    steps = Steps(out, log)
    seeds = list(cfg.seeds)
    tune_seeds = seeds[:cfg.tune_seeds or len(seeds)]
    encoders = {SETUPS[s].encoder for s in cfg.setups}
    probe, probe_key = _probe(cfg, steps) if cfg.mlm or "adapted" in encoders else (None, None)
    builder = Builder(cfg, steps, lambda *a: _featurize(steps, a[0], cfg, *a[1:]),
                      lambda name, store, key, seed: _train_head(steps, name, cfg, store, key, seed),
                      _adapt_step(cfg, steps, probe_key))
    built = {"base": builder.base(seeds, resolve_model(cfg.model))}
    if "adapted" in encoders:
        built["adapted"] = builder.adapted(seeds, tune_seeds, probe, "mlm-probe")
    for name in TUNED:
        if name in encoders:
            built[name] = builder.tuned(name, seeds, tune_seeds, built["base"])
    evals = evaluate_built(cfg, steps, built)
    mlm = mlm_losses(cfg, steps, built, probe) if cfg.mlm else {}
    table = write_report(cfg, out, built, evals, mlm, steps)
    return table + (f"\nWARNING: {missing}\n" if missing else "")


def _subsampled(cfg: CompareConfig, out: Path) -> CompareConfig:
    """cfg with each BEIR dataset replaced by its seeded subsample where max_docs / ood_max_docs ask for one."""
    from headstore.heads.experiments.compare.data import subsample_beir

    def sub(path: str, limit: int | None) -> str:
        return path if limit is None else subsample_beir(path, out / "data", limit, cfg.subsample_seed)
    return dataclasses.replace(cfg, in_domain=sub(cfg.in_domain, cfg.max_docs),
                               out_of_domain=tuple(sub(d, cfg.ood_max_docs) for d in cfg.out_of_domain))


def _adapt_result(summary: dict) -> dict:
    """An MLM run's record: its steps (`total_steps`: the cap), why it stopped ("settled" at a check, or
    "cap"; `capped`), whether its loss settled (featurize.tuning.settle.settled) and its loss curve."""
    keep = ("steps", "total_steps", "finished", "stopped", "capped", "first_loss", "last_loss_mean10", "mlm_head",
            "n_held_out_texts", "losses")
    if not summary.get("finished"):
        raise RuntimeError(f"adapt stopped at step {summary.get('steps')} of {summary.get('total_steps')}")
    is_settled, drop = settled(summary.get("losses") or [])
    return {**{k: summary.get(k) for k in keep}, "settled": is_settled, "second_half_drop": drop}
