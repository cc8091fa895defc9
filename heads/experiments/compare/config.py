"""`cli compare`'s settings: CompareConfig and how a TOML file ([data], [compare], [featurize], [head], [adapt],
[finetune], [mlm]) and command-line overrides become one (`load_compare_config`). The steps that run them are
in `heads.experiments.compare.run`."""
from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import asdict, dataclass, field, fields

from headstore.featurize.encoder.config import AdaptConfig
from headstore.data.keys import device_kind
from headstore.featurize.encoder.config import DEVICES, FeaturizeConfig
from headstore.heads.settings.config import setting_hints, TrainConfig
from headstore.heads.apply.finetune import FinetuneConfig
from headstore.heads.experiments.compare.setups import SETUPS
from headstore.heads.experiments.compare.datasets_root import default_mlm_text
from headstore.heads.network.model import HeadConfig


@dataclass(frozen=True)
class CompareConfig:
    in_domain: str  # dataset the heads train on; its test split is the in-domain figure
    out_of_domain: tuple[str, ...] = ()  # datasets evaluated with the in-domain heads (test split; a table
    # without a split column is scored whole, see heads.training.eval_run.eval_split)
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
    # setup's own), chosen on dev at the first tuning seed (compare.setups.Builder.tuned): three values around
    # the default, a factor of 2 apart, as a head's lr is picked from a small grid
    lr_grid: tuple[float, ...] = (0.5, 1.0, 2.0)
    setups: tuple[str, ...] = tuple(SETUPS)  # the rows (compare.setups.SETUPS); frozen + head always runs
    seeds: tuple[int, ...] = (0, 1, 2)  # three seeds: the least that gives a spread (std) at all
    tune_seeds: int | None = None  # the first this many seeds also re-tune the encoders (None = all): an
    # adapted encoder is shared by the later seeds' heads, a finetune-family row has only these seeds
    ood_exclude_overlap: bool = True  # out-of-domain pairs / queries using an in-domain text are dropped
    n_boot: int = 1000  # bootstrap resamples of every CI
    max_docs: int | None = None  # subsample the in-domain BEIR corpus to this many documents (CPU budget;
    # heads.experiments.compare.data); None = the whole corpus
    ood_max_docs: int | None = None  # the same for each out-of-domain BEIR corpus
    subsample_seed: int = 0  # which queries and distractor documents a subsample keeps
    mlm: bool = True  # MLM loss on held-out text (forgetting)
    mlm_text: str | None = field(default_factory=default_mlm_text)  # general text: wikitext-2 under the datasets root
    mlm_text_split: str | None = "validation"  # wikitext-2 here has validation and test only
    mlm_max_texts: int = 64  # texts per MLM evaluation set: ~1 minute per model on 2 CPU cores
    mlm_holdout_fraction: float = 0.02  # in-domain texts kept out of adaptation, scored for MLM loss
    mlm_probe_steps: int | None = None  # cap on the probe MLM head's steps on the frozen encoder (None: adapt's)
    # where every part runs (stores, heads, MLM adaptation and probe, tuning, evaluation, the MLM loss): "auto"
    # leaves each part its own choice (cuda when available; the MLM loss on the CPU); "cpu" / "cuda" put all of
    # them there (`on_device`); the setting is in every step's key either way (`device_key`)
    device: str = "auto"

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
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r} not valid; choose one of {list(DEVICES)}")
        if self.n_boot < 100:
            raise ValueError(f"n_boot must be >= 100 (a 95% CI from fewer resamples is noise), got {self.n_boot}")


SECTIONS = {"featurize": FeaturizeConfig, "adapt": AdaptConfig, "finetune": FinetuneConfig}
COMPARE_KEYS = ("setups", "seeds", "tune_seeds", "ood_exclude_overlap", "n_boot", "max_docs", "ood_max_docs",
                "subsample_seed", "device")  # the [compare] section


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
    for k in ("in_domain", "model", "base_store", "mlm", "seeds", "setups", "device"):
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


def on_device(cfg: CompareConfig) -> CompareConfig:
    """cfg with the device of its featurize, adapt and finetune settings set to cfg.device (the [featurize],
    [adapt], [finetune] sections' own `device` are overridden); "auto": cfg as it is (each part's own)."""
    if cfg.device == "auto":
        return cfg
    return dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), device=cfg.device)
                                       for name in SECTIONS})


def device_key(cfg: CompareConfig) -> dict:
    """What a step without a device setting of its own (train-head, eval, the MLM loss) adds to its key: the kind
    of device the setting resolves to here (data/keys.py device_kind: "auto" is cuda on a box with a card, else
    cpu), so a step made on a card is never reused on a CPU."""
    return {"device": device_kind(cfg.device)}


def mlm_loss_device(cfg: CompareConfig) -> str:
    """Where the MLM loss (forgetting) is scored: cfg.device, or the CPU for "auto" (mlm_eval's own default)."""
    return "cpu" if cfg.device == "auto" else cfg.device
