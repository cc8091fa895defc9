"""`cli compare`: the three ways to use the encoder, on the same data, in one table.

Setups (beside the frozen encoder's own cosine baseline):
  1. frozen encoder -> stored features -> head                      (featurize, train-head)
  2. MLM-adapted encoder -> stored features -> head                 (adapt, featurize, train-head)
  3. setup 1's head + encoder fine-tuned end to end for one epoch   (finetune, featurize)
Every setup (and each encoder without a head, cosine on raw features) is evaluated on the in-domain
test split and on each out-of-domain dataset (an STS set under an IR head: Spearman of -E), with the
seconds it cost and, optionally, the MLM loss on held-out text (forgetting; see `heads.compare_report`).

Each step writes `OUT/<step>-<key>/` where key hashes the settings that step depends on (including
its inputs' keys) and records `step.json` (settings, seconds, result) when it finishes: a rerun
reuses every finished step and a changed setting reruns only what depends on it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from headstore.data.files import atomic_write_json
from headstore.featurize.config import AdaptConfig
from headstore.featurize.config import FeaturizeConfig
from headstore.heads.settings.config import setting_hints, TrainConfig
from headstore.heads.apply.finetune import FinetuneConfig
from headstore.heads.experiments.datasets_root import default_mlm_text, missing_mlm_text_note
from headstore.heads.network.model import HeadConfig


@dataclass(frozen=True)
class CompareConfig:
    in_domain: str  # dataset the heads train on; its test split is the in-domain figure
    out_of_domain: tuple[str, ...] = ()  # datasets evaluated with the in-domain heads (test split; a table
    # without a split column is scored whole, see heads.training.run.eval_split)
    model: str = "minilm"  # the base encoder
    base_store: str | None = None  # reuse a store of the base encoder's features (else OUT/store-base-*)
    featurize: FeaturizeConfig = FeaturizeConfig()  # its `model` is replaced per encoder
    head: HeadConfig = HeadConfig()
    train: TrainConfig = TrainConfig()
    adapt: AdaptConfig = AdaptConfig(max_steps=50, batch_size=16)  # short: a CPU-sized adaptation
    finetune: FinetuneConfig = FinetuneConfig()
    mlm: bool = True  # MLM loss before/after on held-out text (adds a head-only probe adaptation)
    mlm_text: str | None = field(default_factory=default_mlm_text)  # general text: wikitext-2 under the datasets root
    mlm_text_split: str | None = "validation"  # wikitext-2 here has validation and test only
    mlm_max_texts: int = 64  # texts per MLM evaluation set: ~1 minute per model on 2 CPU cores
    mlm_holdout_fraction: float = 0.02  # in-domain texts kept out of adaptation, scored for MLM loss

    def __post_init__(self):
        if not 0.0 < self.mlm_holdout_fraction < 1.0 and self.mlm:
            raise ValueError(f"mlm_holdout_fraction must be in (0, 1), got {self.mlm_holdout_fraction}")


SECTIONS = {"featurize": FeaturizeConfig, "adapt": AdaptConfig, "finetune": FinetuneConfig}


def _build(cls, values: dict, where: str):
    names = set(setting_hints(cls))  # TrainConfig: its flat settings
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{where}: unknown settings {unknown}; valid: {sorted(names)}")
    return cls(**values)


def load_compare_config(path: str | None = None, **overrides) -> CompareConfig:
    """A CompareConfig from a TOML file ([data], [featurize], [head], [adapt], [finetune], [mlm]) and
    command-line overrides (None = not given)."""
    raw: dict = {}
    if path:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    valid = {"data", "featurize", "head", "adapt", "finetune", "mlm"}
    if set(raw) - valid:
        raise ValueError(f"{path}: unknown sections {sorted(set(raw) - valid)}; valid: {sorted(valid)}")
    data, feat = dict(raw.get("data", {})), dict(raw.get("featurize", {}))
    top = {k: data.pop(k) for k in ("in_domain", "out_of_domain", "mlm_text", "mlm_text_split") if k in data}
    if data:
        raise ValueError(f"{path} [data]: unknown settings {sorted(data)}; valid: in_domain, out_of_domain, mlm_text, mlm_text_split")
    for k in ("model", "base_store"):
        if k in feat:
            top[k] = feat.pop(k)
    for k, v in (raw.get("mlm") or {}).items():
        key = "mlm" if k == "enabled" else f"mlm_{k}"
        if key not in {f.name for f in fields(CompareConfig)}:
            raise ValueError(f"{path} [mlm]: unknown setting {k!r}; valid: enabled, max_texts, holdout_fraction")
        top[key] = v
    head_keys = {f.name for f in fields(HeadConfig)}
    head_raw = raw.get("head", {})
    sections = {"featurize": feat, "adapt": dict(raw.get("adapt", {})), "finetune": dict(raw.get("finetune", {}))}
    o = {k: v for k, v in overrides.items() if v not in (None, ())}
    for k in ("in_domain", "model", "base_store", "mlm"):
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
    top["out_of_domain"] = tuple(top.get("out_of_domain", ()))
    return CompareConfig(**top, **built)


def _key(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


class Steps:
    """Runs named steps once per settings key; `run(name, settings, fn)` -> (dir, result, seconds)."""

    def __init__(self, out: Path, log=print):
        self.out, self.log = out, log
        self.seconds: dict[str, float] = {}
        self.dirs: dict[str, Path] = {}

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
            t0 = time.perf_counter()
            result = fn(folder)
            done = {"name": name, "key": key, "settings": settings, "seconds": time.perf_counter() - t0,
                    "result": result}
            atomic_write_json(record, done, indent=1)
        self.seconds[name], self.dirs[name] = float(done["seconds"]), folder
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


def _train_head(steps: Steps, name: str, cfg: CompareConfig, store: Path, store_key: dict) -> tuple[Path, dict]:
    from headstore.heads.training.run import train_head

    settings = {"store": store_key, "head": asdict(cfg.head), "train": cfg.train.to_dict(), "data": cfg.in_domain}
    folder, _ = steps.run(name, settings, lambda d: _first_metric(
        train_head(str(store), cfg.in_domain, str(d / "head"), cfg.head, cfg.train, progress=True,
                   overwrite=True)))  # the step's own folder: a rerun after a crash replaces its half-made head
    return folder / "head", settings


def _first_metric(metrics: dict) -> dict:
    return {"primary": metrics["primary"], "test": metrics.get("head", {}).get(metrics["primary"])}


def run_compare(cfg: CompareConfig, out_dir: str, log=print) -> str:
    """Run (or reuse) every step, evaluate every setup; write compare.json and compare.md; return the table."""
    from headstore.featurize.tuning.adapt import adapt
    from headstore.heads.experiments.compare_report import evaluate_setups, mlm_losses, write_report
    from headstore.heads.apply.finetune import finetune

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "config.json", asdict(cfg), indent=1)
    missing = missing_mlm_text_note(cfg.mlm, cfg.mlm_text)
    if missing:  # said before the long run and again under the table, never dropped silently
        log(f"[compare] WARNING: {missing}")
    steps = Steps(out, log)
    base_key = {"model": cfg.model}
    base_store, base_feat = _featurize(steps, "featurize-base", cfg, cfg.model, base_key, cfg.base_store)
    head1, head1_key = _train_head(steps, "head-base", cfg, base_store, base_feat)

    adapt_cfg = dataclasses.replace(cfg.adapt, model=cfg.model,
                                    holdout_fraction=cfg.mlm_holdout_fraction if cfg.mlm else cfg.adapt.holdout_fraction)
    adapt_key = {"adapt": asdict(adapt_cfg), "data": cfg.in_domain}
    adapted, _ = steps.run("adapt", adapt_key, lambda d: _adapt_result(adapt(adapt_cfg, [cfg.in_domain], d / "model")))
    adapted = adapted / "model"
    adapted_store, adapted_feat = _featurize(steps, "featurize-adapted", cfg, str(adapted), adapt_key)
    head2, _ = _train_head(steps, "head-adapted", cfg, adapted_store, adapted_feat)

    ft_key = {"head": head1_key, "finetune": asdict(cfg.finetune)}
    ft_dir, _ = steps.run("finetune", ft_key, lambda d: {k: v for k, v in finetune(
        str(head1), str(d), cfg.finetune, str(base_store), cfg.in_domain, cfg.model).items() if k != "history"})
    ft_store, _ = _featurize(steps, "featurize-finetuned", cfg, str(ft_dir / "encoder"), ft_key)

    probe = None
    if cfg.mlm:
        probe_cfg = dataclasses.replace(adapt_cfg, train_encoder=False)
        probe_dir, _ = steps.run("mlm-probe", {"adapt": asdict(probe_cfg), "data": cfg.in_domain},
                                 lambda d: _adapt_result(adapt(probe_cfg, [cfg.in_domain], d / "model")))
        probe = probe_dir / "model"

    encoders = {"base": {"store": base_store, "seconds": steps.seconds["featurize-base"]},
                "adapted": {"store": adapted_store,
                            "seconds": steps.seconds["adapt"] + steps.seconds["featurize-adapted"]},
                "finetuned": {"store": ft_store,
                              "seconds": sum(steps.seconds[s] for s in ("featurize-base", "head-base", "finetune",
                                                                        "featurize-finetuned"))}}
    setups = [  # (row label, encoder, head dir or None for the encoder's own cosine, extra seconds)
        (f"frozen {cfg.model} (cosine, no head)", "base", None, 0.0),
        ("1: frozen encoder + head", "base", head1, steps.seconds["head-base"]),
        ("adapted encoder (cosine, no head)", "adapted", None, 0.0),
        ("2: adapt + head", "adapted", head2, steps.seconds["head-adapted"]),
        ("fine-tuned encoder (cosine, no head)", "finetuned", None, 0.0),
        ("3: fine-tune encoder + head", "finetuned", ft_dir / "head", 0.0),
    ]
    rows = evaluate_setups(cfg, out, setups, encoders, {"base": head1, "adapted": head2, "finetuned": ft_dir / "head"})
    mlm = mlm_losses(cfg, steps, {"base": probe, "adapted": adapted, "finetuned": ft_dir / "encoder"}, probe) \
        if cfg.mlm else {}
    table = write_report(cfg, out, rows, mlm, steps.seconds)
    return table + (f"\nWARNING: {missing}\n" if missing else "")


def _adapt_result(summary: dict) -> dict:
    keep = ("steps", "total_steps", "finished", "first_loss", "last_loss_mean10", "mlm_head", "n_held_out_texts")
    if not summary.get("finished"):
        raise RuntimeError(f"adapt stopped at step {summary.get('steps')} of {summary.get('total_steps')}")
    return {k: summary.get(k) for k in keep}
