"""`cli compare`: every way to use the encoder, on the same data, over seeds, with confidence intervals.

The setups (the registries of `heads.experiments.compare_setups`): the frozen encoder's own cosine; frozen
encoder -> stored features -> head; MLM-adapted encoder + head; adapters + head, LoRA + head and the encoder
fine-tuned end to end + head (`cli finetune` from that seed's frozen + head); each tuned encoder also without
a head. Every setup runs at each of `seeds` (a seed sets the head's init and batch order and each tuning
run's seed); each is evaluated on the in-domain test split and on each out-of-domain dataset, with the
seconds and peak memory it cost, its trainable parameters and, optionally, the MLM loss on held-out text
(forgetting). `heads.experiments.compare_report` turns the per-query / per-pair values into mean +- std over
seeds, bootstrap CIs and each setup's paired difference from frozen + head.

Each step writes `OUT/<step>-<key>/` where key hashes the settings that step depends on (including
its inputs' keys and its seed) and records `step.json` (settings, seconds, peak memory, result) when it
finishes: a rerun (or a run after an interruption) reuses every finished step, and a changed setting reruns
only what depends on it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from headstore.data.files import atomic_write_json
from headstore.featurize.config import AdaptConfig
from headstore.featurize.config import FeaturizeConfig
from headstore.heads.settings.config import setting_hints, TrainConfig
from headstore.heads.apply.finetune import FinetuneConfig
from headstore.heads.experiments.compare_setups import SETUPS, TUNED, Builder, settled
from headstore.heads.experiments.datasets_root import default_mlm_text, missing_mlm_text_note
from headstore.heads.network.model import HeadConfig


@dataclass(frozen=True)
class CompareConfig:
    in_domain: str  # dataset the heads train on; its test split is the in-domain figure
    out_of_domain: tuple[str, ...] = ()  # datasets evaluated with the in-domain heads (test split; a table
    # without a split column is scored whole, see heads.training.run.eval_split)
    model: str = "minilm"  # the base encoder
    base_store: str | None = None  # reuse a store of the base encoder's features (else OUT/featurize-base-*)
    featurize: FeaturizeConfig = FeaturizeConfig()  # its `model` is replaced per encoder
    head: HeadConfig = HeadConfig()
    train: TrainConfig = TrainConfig()  # its seed is replaced by each of `seeds`
    # the MLM adaptation and the probe run until their loss settles (featurize.tuning.settle), checked every 100
    # steps, max_steps the cap: 1,000 steps of 16 x 128 tokens, ~10 min of MiniLM on 2 CPU cores
    adapt: AdaptConfig = AdaptConfig(max_steps=1000, batch_size=16, until_settled=True, settle_check=100)
    finetune: FinetuneConfig = FinetuneConfig()  # its setup and seed are replaced per setup and seed
    # [finetune] lr_grid: each tuned setup's encoder lr candidates, factors of its default (encoder_lr, else the
    # setup's own), chosen on dev at the first tuning seed (compare_setups.Builder.tuned): three values around
    # the default, a factor of 2 apart, as a head's lr is picked from a small grid
    lr_grid: tuple[float, ...] = (0.5, 1.0, 2.0)
    setups: tuple[str, ...] = tuple(SETUPS)  # the rows (compare_setups.SETUPS); frozen + head always runs
    seeds: tuple[int, ...] = (0, 1, 2)  # three seeds: the least that gives a spread (std) at all
    tune_seeds: int | None = None  # the first this many seeds also re-tune the encoders (None = all): an
    # adapted encoder is shared by the later seeds' heads, a finetune-family row has only these seeds
    ood_exclude_overlap: bool = True  # out-of-domain pairs / queries using an in-domain text are dropped
    n_boot: int = 1000  # bootstrap resamples of every CI
    max_docs: int | None = None  # subsample the in-domain BEIR corpus to this many documents (CPU budget;
    # heads.experiments.compare_data); None = the whole corpus
    ood_max_docs: int | None = None  # the same for each out-of-domain BEIR corpus
    subsample_seed: int = 0  # which queries and distractor documents a subsample keeps
    mlm: bool = True  # MLM loss on held-out text (forgetting)
    mlm_text: str | None = field(default_factory=default_mlm_text)  # general text: wikitext-2 under the datasets root
    mlm_text_split: str | None = "validation"  # wikitext-2 here has validation and test only
    mlm_max_texts: int = 64  # texts per MLM evaluation set: ~1 minute per model on 2 CPU cores
    mlm_holdout_fraction: float = 0.02  # in-domain texts kept out of adaptation, scored for MLM loss
    mlm_probe_steps: int | None = None  # cap on the probe MLM head's steps on the frozen encoder (None: adapt's)

    def __post_init__(self):
        if not 0.0 < self.mlm_holdout_fraction < 1.0 and self.mlm:
            raise ValueError(f"mlm_holdout_fraction must be in (0, 1), got {self.mlm_holdout_fraction}")
        unknown = sorted(set(self.setups) - set(SETUPS))
        if unknown:
            raise ValueError(f"setups: unknown {unknown}; valid: {sorted(SETUPS)}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ValueError(f"seeds must be distinct integers >= 0, got {list(self.seeds)}")
        if self.tune_seeds is not None and not 1 <= self.tune_seeds <= len(self.seeds):
            raise ValueError(f"tune_seeds must be in 1..{len(self.seeds)} (the number of seeds), got {self.tune_seeds}")
        for name in ("max_docs", "ood_max_docs"):
            if getattr(self, name) is not None and getattr(self, name) < 10:
                raise ValueError(f"{name} must be >= 10 (or unset: the whole corpus), got {getattr(self, name)}")
        if not self.lr_grid or len(set(self.lr_grid)) != len(self.lr_grid) or \
                not all(math.isfinite(f) and f > 0 for f in self.lr_grid):
            raise ValueError(f"[finetune] lr_grid must be distinct finite factors > 0, got {list(self.lr_grid)}")
        if self.n_boot < 100:
            raise ValueError(f"n_boot must be >= 100 (a 95% CI from fewer resamples is noise), got {self.n_boot}")


SECTIONS = {"featurize": FeaturizeConfig, "adapt": AdaptConfig, "finetune": FinetuneConfig}
COMPARE_KEYS = ("setups", "seeds", "tune_seeds", "ood_exclude_overlap", "n_boot", "max_docs", "ood_max_docs",
                "subsample_seed")  # the [compare] section


def _build(cls, values: dict, where: str):
    names = set(setting_hints(cls))  # TrainConfig: its flat settings
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{where}: unknown settings {unknown}; valid: {sorted(names)}")
    return cls(**values)


def _top_level(raw: dict, path) -> dict:
    """CompareConfig's own settings from [data], [featurize] (model, base_store), [compare] and [mlm]."""
    data, feat = dict(raw.get("data", {})), raw.get("featurize", {})
    top = {k: data.pop(k) for k in ("in_domain", "out_of_domain", "mlm_text", "mlm_text_split") if k in data}
    if data:
        raise ValueError(f"{path} [data]: unknown settings {sorted(data)}; valid: in_domain, out_of_domain, mlm_text, mlm_text_split")
    top.update({k: feat[k] for k in ("model", "base_store") if k in feat})
    compare = raw.get("compare") or {}
    if set(compare) - set(COMPARE_KEYS):
        raise ValueError(f"{path} [compare]: unknown settings {sorted(set(compare) - set(COMPARE_KEYS))}; "
                         f"valid: {list(COMPARE_KEYS)}")
    top.update(compare)
    for k, v in (raw.get("mlm") or {}).items():
        key = "mlm" if k == "enabled" else f"mlm_{k}"
        if key not in {f.name for f in fields(CompareConfig)}:
            raise ValueError(f"{path} [mlm]: unknown setting {k!r}; valid: enabled, max_texts, holdout_fraction, probe_steps")
        top[key] = v
    return top


def split_list(text: str | None, kind, option: str) -> tuple | None:
    """"0,1,2" -> (0, 1, 2) for a command-line list option (None: not given)."""
    if text is None:
        return None
    try:
        return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{option} {text!r}: give comma-separated {kind.__name__} values") from None


def load_compare_config(path: str | None = None, **overrides) -> CompareConfig:
    """A CompareConfig from a TOML file ([data], [compare], [featurize], [head], [adapt], [finetune], [mlm])
    and command-line overrides (None = not given)."""
    raw: dict = {}
    if path:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    valid = {"data", "compare", "featurize", "head", "adapt", "finetune", "mlm"}
    if set(raw) - valid:
        raise ValueError(f"{path}: unknown sections {sorted(set(raw) - valid)}; valid: {sorted(valid)}")
    top = _top_level(raw, path)
    feat = {k: v for k, v in raw.get("featurize", {}).items() if k not in ("model", "base_store")}
    head_keys = {f.name for f in fields(HeadConfig)}
    head_raw = raw.get("head", {})
    sections = {"featurize": feat, "adapt": dict(raw.get("adapt", {})), "finetune": dict(raw.get("finetune", {}))}
    if "lr_grid" in sections["finetune"]:  # compare's own setting, kept in the section it is about
        top["lr_grid"] = tuple(sections["finetune"].pop("lr_grid"))
    o = {k: v for k, v in overrides.items() if v not in (None, ())}
    for k in ("in_domain", "model", "base_store", "mlm", "seeds", "setups"):
        if k in o:
            top[k] = o[k]
    if "out_of_domain" in o:
        top["out_of_domain"] = list(o["out_of_domain"])
    if "adapt_steps" in o:
        sections["adapt"]["max_steps"] = o["adapt_steps"]
    if "finetune_steps" in o:
        sections["finetune"]["max_steps"] = o["finetune_steps"]
    if "in_domain" not in top:
        raise ValueError("compare needs an in-domain dataset: [data] in_domain in --config, or --in-domain")
    adapt_defaults = asdict(CompareConfig.__dataclass_fields__["adapt"].default)
    built = {name: _build(cls, {**(adapt_defaults if name == "adapt" else {}), **sections[name]}, f"[{name}]")
             for name, cls in SECTIONS.items()}
    built["head"] = _build(HeadConfig, {k: v for k, v in head_raw.items() if k in head_keys}, "[head]")
    built["train"] = _build(TrainConfig, {k: v for k, v in head_raw.items() if k not in head_keys}, "[head]")
    for k in ("out_of_domain", "setups", "seeds"):
        if k in top:
            top[k] = tuple(top[k])
    return CompareConfig(**top, **built)


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
    """Runs named steps once per settings key; `run(name, settings, fn)` -> (dir, result).

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

    def key_of(self, path) -> str | None:
        """The key of the step whose folder holds `path`; None for a path no step of this run made."""
        path = Path(path).resolve()
        return next((key for folder, key in self.keys.items() if folder == path or folder in path.parents), None)

    def run(self, name: str, settings: dict, fn) -> tuple[Path, dict]:
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
            done = {"name": name, "key": key, "settings": settings, "seconds": time.perf_counter() - t0,
                    "peak_mb": _peak_memory_mb() if measured else None, "result": result}
            atomic_write_json(record, done, indent=1)
        self.seconds[name], self.dirs[name] = float(done["seconds"]), folder
        self.keys[folder.resolve()] = key
        self.peak_mb[name], self.results[name] = done.get("peak_mb"), done["result"]
        return folder, done["result"]


def _featurize(steps: Steps, name: str, cfg: CompareConfig, model: str, parent_key: dict,
               store: str | None = None) -> tuple[Path, dict]:
    from headstore.featurize.run import featurize

    fcfg = dataclasses.replace(cfg.featurize, model=model)
    datasets = [cfg.in_domain, *cfg.out_of_domain]
    settings = {"encoder": parent_key, "featurize": asdict(fcfg), "data": datasets, "store": store}

    def go(folder: Path) -> dict:
        summary = featurize(fcfg, datasets, store or folder / "store")
        return {"store": str(store or folder / "store"), "fingerprint": summary["fingerprint"],
                "n_encoded": summary["n_encoded"]}

    folder, result = steps.run(name, settings, go)
    return Path(result["store"]), settings


def _train_head(steps: Steps, name: str, cfg: CompareConfig, store: Path, store_key: dict,
                seed: int) -> tuple[Path, dict]:
    from headstore.heads.training.run import train_head

    train = cfg.train.replace(seed=seed)
    settings = {"store": store_key, "head": asdict(cfg.head), "train": train.to_dict(), "data": cfg.in_domain}
    folder, _ = steps.run(name, settings, lambda d: _first_metric(
        train_head(str(store), cfg.in_domain, str(d / "head"), cfg.head, train, progress=True,
                   overwrite=True)))  # the step's own folder: a rerun after a crash replaces its half-made head
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
    key = {"adapt": asdict(probe_cfg), "data": cfg.in_domain}
    folder, _ = steps.run("mlm-probe", key, lambda d: _adapt_result(adapt(probe_cfg, [cfg.in_domain], d / "model")))
    return folder / "model", key


def _adapt_step(cfg: CompareConfig, steps: Steps, probe_key: dict):
    """fn(name, probe dir, seed) -> (adapted model dir, its key): MLM adaptation from the probe's head."""
    from headstore.featurize.tuning.adapt import adapt

    def run(name: str, probe: Path, seed: int):
        adapt_cfg = dataclasses.replace(_adapt_settings(cfg), model=str(probe), seed=seed)
        key = {"adapt": {**asdict(adapt_cfg), "model": cfg.model}, "probe": probe_key, "data": cfg.in_domain}
        folder, _ = steps.run(name, key, lambda d: _adapt_result(adapt(adapt_cfg, [cfg.in_domain], d / "model")))
        return folder / "model", key
    return run


def run_compare(cfg: CompareConfig, out_dir: str, log=print) -> str:
    """Run (or reuse) every step at every seed, evaluate every setup; write compare.json, compare.md and
    compare.png; return the terminal table."""
    from headstore.featurize.model import resolve_model
    from headstore.heads.experiments.compare_report import evaluate_built, mlm_losses
    from headstore.heads.experiments.compare_table import write_report

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
    from headstore.heads.experiments.compare_data import subsample_beir

    def sub(path: str, limit: int | None) -> str:
        return path if limit is None else subsample_beir(path, out / "data", limit, cfg.subsample_seed)
    return dataclasses.replace(cfg, in_domain=sub(cfg.in_domain, cfg.max_docs),
                               out_of_domain=tuple(sub(d, cfg.ood_max_docs) for d in cfg.out_of_domain))


def _adapt_result(summary: dict) -> dict:
    """An MLM run's record: its steps (`total_steps`: the cap), why it stopped ("settled" at a check, or
    "cap"; `capped`), whether its loss settled (compare_setups.settled) and its loss curve."""
    keep = ("steps", "total_steps", "finished", "stopped", "capped", "first_loss", "last_loss_mean10", "mlm_head",
            "n_held_out_texts", "losses")
    if not summary.get("finished"):
        raise RuntimeError(f"adapt stopped at step {summary.get('steps')} of {summary.get('total_steps')}")
    is_settled, drop = settled(summary.get("losses") or [])
    return {**{k: summary.get(k) for k in keep}, "settled": is_settled, "second_half_drop": drop}
