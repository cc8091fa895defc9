"""Settings of a head: small frozen dataclasses of plain values, saved beside every head (torch-free).

- `HeadConfig`: the head's shape.
- `TrainConfig`: how it is trained, in five sections: `OptimConfig` (optimiser, schedule, seed, maths),
  `ObjectiveConfig` (the loss and its constants), `NegativesConfig` (mined hard negatives),
  `SelectionConfig` (choosing the kept weights on dev) and `DataConfig` (how training texts are drawn and
  presented). Every setting has one name across the sections, so on disk (config.json "train", grid
  results columns, head ids) and on the command line the settings stay one flat set of plain values:
  `TrainConfig(lr=1e-3, loss="mnr")`, `cfg.lr`, `cfg.to_dict()`, `TrainConfig.from_dict(d)`,
  `cfg.replace(seed=1)`.
The command-line options of these settings are generated from the fields (heads.settings.options), so a
setting's default, choices and help live here once.
"""
from __future__ import annotations

import math
import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Optional

from headstore.data.errors import SettingError
from headstore.featurize.tuning.schedule import SCHEDULES
from headstore.heads.scoring.losses import LOSSES, LossConfig, scoring_energy
from headstore.heads.scoring.losses.settings import DEFAULT_IMPOSTORS, GRADED_MODES, IMPOSTOR_MODES

PRECISIONS = ("fp32", "bf16")  # head training maths (heads.training.train): fp32, or bf16 autocast for the matmuls
NORMALIZATIONS = ("none", "center", "l2", "center-l2", "standardize")
ENERGY_NAMES = ("cosine", "l1", "l2")  # heads.scoring.energy.ENERGIES implements each
ACTIVATION_NAMES = ("gelu", "identity", "relu", "tanh")  # heads.network.model implements each
INITS = ("default", "identity")
SIDES = ("both", "query")  # which texts pass through a head: every text, or queries only (heads.network.model.encode)
STRENGTH_AUTO = "auto"  # --strength auto: chosen after training on dev (heads.training.strength)


def parse_strength(value: str) -> Optional[float]:
    """A `strength` setting: None for "auto", else the number in [0, 1] (ValueError naming the valid values)."""
    if value == STRENGTH_AUTO:
        return None
    try:
        a = float(value)
    except (TypeError, ValueError):
        a = float("nan")
    if not 0.0 <= a <= 1.0:  # also refuses NaN
        raise SettingError("strength", f"must be 'auto' or a number in [0, 1], got {value!r}")
    return a
# settings whose default depends on the kind of data (each kind's `defaults`, heads.kinds); the command
# line leaves them unset so the kind can fill them in, and config.json "defaults" says which applied
KIND_DEPENDENT = ("depth", "lr", "epochs", "anchor_weight", "loss", "normalize", "hidden")  # normalize: also the loss's

# cli grid --test-scope: which heads of a stack are ranked on test (heads.experiments.grid_scope says why)
TEST_SCOPES = ("auto", "all", "selected")


def _opt(help: str = "", choices=None, cli: bool = True, flag: str | None = None):
    """Field metadata the command-line options are generated from (heads.settings.options)."""
    return {"help": help, "choices": choices, "cli": cli, "flag": flag}


@dataclass(frozen=True)
class HeadConfig:
    depth: int = field(default=2, metadata=_opt("Linear layers (0 = identity)."))  # 2: SciFact's dev choice
    # (round 2); graded (STS) tables take 1 (heads.kinds.sts)
    hidden: int = field(default=512, metadata={**_opt(), "kind_help": (
        "train-head's default: 512; a classifier head (ce) on labelled texts 1024 (docs/labels.md); cli grid: 512 "
        "unless set.")})  # width of hidden layers; ~1.3x MiniLM's 384 keeps heads small
    out_dim: Optional[int] = field(default=None, metadata=_opt())  # None -> in_dim (what a residual head needs)
    activation: str = field(default="gelu", metadata=_opt(choices=ACTIVATION_NAMES))  # GELU as in the encoder
    dropout: float = field(default=0.0, metadata=_opt())  # 0 so stacked and separate training agree exactly
    layer_norm: bool = field(default=False, metadata=_opt())  # off: features are already pooled
    residual: bool = field(default=True, metadata=_opt(
        "f(x) = x + g(x), starting exactly at the frozen features (needs out-dim = feature dim)."))
    # g's last layer zero-initialised: training moves away from the baseline only as far as the data asks
    init: str = field(default="default", metadata=_opt(choices=INITS, cli=False))  # "identity": W = I (depth 1)
    in_dim: Optional[int] = field(default=None, metadata=_opt(cli=False))  # the store's feature dim, set from it
    mix: int = field(default=1, metadata=_opt(cli=False))  # stored arrays mixed into the input (set from --array)
    mix_init: float = field(default=0.8, metadata=_opt(
        "With --array A+B+...: the starting softmax weight of the first array in the head's layer mix."))
    # near the one-layer head; lower layers add 0.003 Spearman on STS-B dev (docs/l1-energy.md)
    sides: str = field(default="both", metadata=_opt(
        "Which texts pass through the head: both (queries and documents), or query (documents keep their frozen "
        "normalised features, E(q, d) = ||f(q) - n(d)||: a corpus index serves every such head).", choices=SIDES))
    # both: the siamese head of the method (and the ids of every earlier head); query: issue 20's lever 3

    def __post_init__(self):
        check_types(type(self), asdict(self))
        if self.activation not in ACTIVATION_NAMES:
            raise ValueError(f"activation={self.activation!r}; valid: {sorted(ACTIVATION_NAMES)}")
        if self.init not in INITS:
            raise ValueError(f"init={self.init!r}; valid: {list(INITS)}")
        bounds = [("depth", self.depth >= 0, ">= 0 (0 = identity)"), ("hidden", self.hidden >= 1, ">= 1"),
                  ("dropout", 0.0 <= self.dropout < 1.0, "in [0, 1)"), ("mix", self.mix >= 1, ">= 1 (arrays mixed)"),
                  ("mix_init", 0.0 < self.mix_init < 1.0, "in (0, 1)")]
        for name, holds, what in bounds:
            if not holds:
                raise SettingError(name, f"must be {what}, got {getattr(self, name)}")
        if self.sides not in SIDES:
            raise ValueError(f"sides={self.sides!r}; valid: {list(SIDES)}")

    @property
    def out_features(self) -> int:
        """The dimension a head outputs."""
        assert self.in_dim is not None
        if self.depth == 0:
            return self.in_dim
        return self.in_dim if self.out_dim is None else self.out_dim

    def layer_dims(self) -> list[int]:
        """[in_dim, hidden, ..., out]: depth + 1 sizes (just [in_dim] at depth 0)."""
        assert self.in_dim is not None
        if self.depth == 0:
            return [self.in_dim]
        return [self.in_dim] + [self.hidden] * (self.depth - 1) + [self.out_features]


@dataclass(frozen=True)
class OptimConfig:
    lr: float = field(default=3e-3, metadata=_opt())  # AdamW on a small MLP over fixed features; SciFact's dev
    # choice with the 2-layer residual head (round 2); graded tables and labelled texts take 1e-3 (their kinds)
    weight_decay: float = field(default=0.01, metadata=_opt())  # AdamW's usual decoupled decay
    decay_to_init: float = field(default=0.0, metadata=_opt(
        "L2-SP pull of the weights toward their initial values."))  # 0 = off
    epochs: int = field(default=15, metadata=_opt("Early stopping on dev either way."))  # few labelled pairs
    # (SciFact ~800): 15 passes with early stopping (graded tables: 10, their best epochs are 1-5)
    batch_size: int = field(default=64, metadata=_opt())  # in-batch impostors per anchor = batch_size - 1
    schedule: str = field(default="cosine", metadata=_opt(choices=SCHEDULES))  # decay after the warm-up
    warmup_ratio: float = field(default=0.1, metadata=_opt())  # linear warm-up over the first 10% of steps
    grad_clip: float = field(default=1.0, metadata=_opt())  # per-head clip; guards the exp() of the energy loss
    seed: int = field(default=0, metadata=_opt())  # head init, batch order, dropout
    precision: str = field(default="fp32", metadata=_opt(
        "Training maths: fp32, or bf16 autocast for the matmuls (fp32 master weights and losses; faster on "
        "CPUs with AMX and on GPUs; emulated and far slower on CPUs without AMX/AVX-512-BF16, which warns).",
        choices=PRECISIONS))  # fp32 stays the default so results and head
    # ids of earlier runs do not move; bf16 test metrics lie within the fp32 run's 95% CI (README). No
    # `auto`: a head's numbers, and a grid's head ids, would then depend on the CPU that trained it (a grid
    # resumed on another machine would train its heads again under other ids)


@dataclass(frozen=True)
class ObjectiveConfig:
    loss: str = field(default="l1-energy", metadata={**_opt(choices=tuple(sorted(LOSSES))), "kind_help": (
        "train-head's default per kind of data: labelled texts ce (a classifier head, docs/labels.md), other "
        "kinds l1-energy; cli grid: l1-energy unless set.")})  # heads.scoring.losses
    energy: str = field(default="l1", metadata=_opt(
        "E(a, b) between head outputs (mnr is cosine by definition).", choices=ENERGY_NAMES))  # the premise
    q: Optional[float] = field(default=None, metadata=_opt(
        "Energy bound Q of l1-energy (default per energy)."))  # None: the per-energy default (heads.scoring.losses)
    tau: Optional[float] = field(default=None, metadata=_opt("Temperature of l1-ce (default per energy)."))
    margin: Optional[float] = field(default=None, metadata=_opt(
        "Margin of contrastive/triplet (default per energy)."))
    impostors: str = field(default=DEFAULT_IMPOSTORS, metadata=_opt(choices=IMPOSTOR_MODES))  # the mean over
    # all impostors is dominated by easy ones; the semi-hard one per anchor trains (docs/l1-energy.md)
    genuine_weight: float = field(default=1.0, metadata=_opt())  # genuine vs impostor balance
    label_smoothing: float = field(default=0.1, metadata=_opt(
        "ce: the share of each class target spread evenly over the classes."))  # Szegedy et al. 2016's 0.1
    graded: str = field(default="pearson", metadata=_opt(
        "How graded (STS) or 0/1 labels enter l1-energy / contrastive: weight (s and 1 - s), regress (E toward "
        "Q (1 - s)), pearson (1 + corr(E, s) per batch).", choices=GRADED_MODES))  # pearson: the one form
    # that beats the frozen features on STS-B (the others overfit; docs/l1-energy.md)
    q_start: Optional[float] = field(default=None, metadata=_opt(
        "A Q schedule: l1-energy's Q goes linearly from this to --q over training."))  # None: a fixed Q
    anchor_weight: float = field(default=0.0, metadata={**_opt(
        "Anchor on the unlabeled store: + lambda * mean ||f(x) - x||_1 over store rows that are not training "
        "texts, sampled each step (--anchor-data names the rows)."), "kind_help": (
        "train-head's default per kind of data: IR and positive pairs 2 (docs/robust.md), other kinds 0 "
        "(off); cli grid: 0 unless set.")})  # 0 here (grids, and the ids of their heads, do not move); the
    # IR kind's train-head default is the SciFact study's (heads.kinds.ir, docs/robust.md)


@dataclass(frozen=True)
class NegativesConfig:
    mined_k: int = field(default=8, metadata=_opt(
        "Hard negatives per pair mined from the stored corpus (IR)."))  # 8 beat 0 for every loss on SciFact
    # and matched 16 (docs/l1-energy.md); 0 = none
    remine: bool = field(default=True, metadata=_opt(
        "Re-mine hard negatives each epoch in the head's own space."))  # SciFact dev: +0.004 mean
    remine_every: int = field(default=1, metadata=_opt(
        "With --remine: re-mine in head space at epochs N, 2N, ... (the negatives of the last re-mine in between)."))
    # 1: every epoch, what the studies measured; on a large corpus a re-mine of a stack of H heads embeds H x
    # every pooled document (~200k at 1M documents), so N trades the negatives' freshness for time
    exact_max: int = field(default=20_000, metadata=_opt(
        "Largest corpus (documents) searched exactly for mining and dev ranking; above it, candidates: each "
        "query's frozen top --pool-k (an exact cosine search, done once), re-scored in head space each epoch."))
    # 20,000: SciFact (5k) and corpora of its size keep the exact search and their numbers; above ~20k an
    # exact re-mine + dev ranking per epoch costs more than the epoch's training steps (bench/scale/scale_heads.py)
    pool_k: int = field(default=100, metadata=_opt(
        "Candidates per query above --exact-max: the frozen space's top-k documents."))  # 100: 12x the 8
    # mined negatives; the dev candidates' share of the exact top-10 is reported in metrics.json

    def on_candidates(self, n_docs: int) -> bool:
        """Whether a corpus of `n_docs` documents is mined and dev-ranked on candidates (above exact_max)."""
        return n_docs > self.exact_max


@dataclass(frozen=True)
class SelectionConfig:
    patience: int = field(default=3, metadata=_opt())  # epochs without a dev improvement before a head stops
    guard: bool = field(default=True, metadata=_opt(
        "Keep the starting point (the identity head) as a candidate: a head that never beats it on dev is "
        "returned as it; a head worse than the frozen features is reported."))  # never worse than no head
    strength: str = field(default="1", metadata=_opt(
        "Strength a of the trained update, after training: f_a(x) = x + a g(x) for a residual head (other "
        "heads: a of the way from their starting weights). A number in [0, 1], or 'auto': chosen on dev (the "
        "in-domain dev split and the --select-ood sets, the rule in docs/robust.md)."))  # 1: the trained head as
    # it is (earlier heads and figures do not move); the study's choice is in docs/robust.md


@dataclass(frozen=True)
class DataConfig:
    normalize: str = field(default="l2", metadata={**_opt(choices=NORMALIZATIONS), "kind_help": (
        "train-head's default: l2; standardize for a classifier head (ce), whose MLP learns slowly on unit-norm "
        "rows; cli grid: l2 unless set.")})  # features before the head: L2
    # puts every L1 energy on one scale (~10-20 for MiniLM), so one energy bound Q fits all data
    shots: int = field(default=0, metadata=_opt(
        "Labelled texts: texts per class drawn with --seed (few-shot); 0 = all of train."))
    per_class: int = field(default=4, metadata=_opt(
        "Labelled texts: K texts per class in a batch of batch-size // K classes."))  # 3 partners per anchor
    hierarchy: bool = field(default=False, metadata=_opt(
        "Labelled texts: targets from the label tree (shared-prefix depth / depth)."))
    anchor_data: str = field(default="", metadata=_opt(
        "With --anchor-weight: a dataset whose texts in the store are the anchor rows (training texts left "
        "out); empty = every row of the store."))  # the whole store: the unlabeled corpus it holds


SECTIONS = {"optimizer": OptimConfig, "objective": ObjectiveConfig, "negatives": NegativesConfig,
            "selection": SelectionConfig, "data": DataConfig}
SECTION_OF = {f.name: name for name, cls in SECTIONS.items() for f in fields(cls)}  # setting -> its section
assert len(SECTION_OF) == sum(len(fields(c)) for c in SECTIONS.values()), "a setting name is in two sections"


@dataclass(frozen=True, init=False)
class TrainConfig:
    """The training settings: five sections, read and written as one flat set of settings (module doc)."""

    optimizer: OptimConfig
    objective: ObjectiveConfig
    negatives: NegativesConfig
    selection: SelectionConfig
    data: DataConfig

    def __init__(self, **settings):
        unknown = sorted(set(settings) - set(SECTION_OF) - set(SECTIONS))
        if unknown:
            raise ValueError(f"unknown training settings {unknown}; valid: {sorted(SECTION_OF)}")
        check_types(type(self), {k: v for k, v in settings.items() if k in SECTION_OF})
        for name, cls in SECTIONS.items():
            given = settings.get(name) or cls()
            values = {k: v for k, v in settings.items() if SECTION_OF.get(k) == name}
            object.__setattr__(self, name, cls(**{**asdict(given), **values}))
        self._check()

    def __getattr__(self, name: str):
        section = SECTION_OF.get(name)
        if section is None:
            raise AttributeError(f"TrainConfig has no setting {name!r}")
        return getattr(object.__getattribute__(self, section), name)

    def _check(self) -> None:
        checks = [("loss", self.loss, sorted(LOSSES)), ("energy", self.energy, sorted(ENERGY_NAMES)),
                  ("schedule", self.schedule, SCHEDULES), ("normalize", self.normalize, NORMALIZATIONS),
                  ("impostors", self.impostors, IMPOSTOR_MODES), ("precision", self.precision, PRECISIONS),
                  ("graded", self.graded, GRADED_MODES)]
        for name, value, valid in checks:
            if value not in valid:
                raise ValueError(f"{name}={value!r}; valid: {list(valid)}")
        bounds = [  # (setting, holds, what it must be)
            ("lr", math.isfinite(self.lr) and self.lr > 0, "a finite number > 0"),
            ("weight_decay", math.isfinite(self.weight_decay) and self.weight_decay >= 0, "a finite number >= 0"),
            ("decay_to_init", math.isfinite(self.decay_to_init) and self.decay_to_init >= 0, "a finite number >= 0"),
            ("epochs", self.epochs >= 1, ">= 1"),
            ("batch_size", self.batch_size >= 2, ">= 2 (in-batch impostors need another pair)"),
            ("warmup_ratio", 0 <= self.warmup_ratio <= 1, "in [0, 1] (a share of the training steps)"),
            ("grad_clip", math.isfinite(self.grad_clip) and self.grad_clip >= 0, "a finite number >= 0 (0 = no clipping)"),
            ("seed", self.seed >= 0, ">= 0"),
            ("patience", self.patience >= 1, ">= 1 (epochs without a dev improvement before stopping)"),
            ("mined_k", self.mined_k >= 0, ">= 0 (0 = no mined negatives)"),
            ("remine_every", self.remine_every >= 1, ">= 1 (1 = every epoch)"),
            ("exact_max", self.exact_max >= 0, ">= 0 (corpus documents searched exactly)"),
            ("pool_k", self.pool_k >= 10, ">= 10 (candidates per query; nDCG@10 needs 10)"),
            ("q_start", self.q_start is None or (math.isfinite(self.q_start) and self.q_start > 0),
             "a finite number > 0 (or unset: no Q schedule)"),
            ("anchor_weight", math.isfinite(self.anchor_weight) and self.anchor_weight >= 0,
             "a finite number >= 0 (0 = no anchor)"),
            ("shots", self.shots >= 0, ">= 0 (0 = all of train)"),
            ("per_class", self.per_class >= 2, ">= 2 (a text needs a partner of its class)"),
        ]
        for name, holds, what in bounds:
            if not holds:
                raise SettingError(name, f"must be {what}, got {getattr(self, name)}")
        self.loss_config()  # q, tau, margin, genuine_weight: finite and positive
        parse_strength(self.strength)

    @property
    def eval_energy(self) -> str:
        """The energy heads are trained and ranked with (a loss that ignores the energy is cosine: mnr, supcon;
        heads.scoring.losses.scoring_energy, the one rule)."""
        return scoring_energy(self.loss, self.energy)

    def loss_config(self) -> LossConfig:
        return LossConfig(q=self.q, tau=self.tau, margin=self.margin, impostors=self.impostors,
                          genuine_weight=self.genuine_weight, graded=self.graded, label_smoothing=self.label_smoothing)

    def to_dict(self) -> dict:
        """Every setting, flat (what config.json, grid results and head ids hold)."""
        return {k: v for name in SECTIONS for k, v in asdict(object.__getattribute__(self, name)).items()}

    def replace(self, **settings) -> "TrainConfig":
        return TrainConfig(**{**self.to_dict(), **settings})

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(SECTION_OF)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        unknown = sorted(set(d) - set(SECTION_OF))
        if unknown:
            raise ValueError(f"unknown training settings {unknown}; valid: {sorted(SECTION_OF)}")
        return cls(**d)

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.to_dict().items() if v != _DEFAULTS[k]}
        return f"TrainConfig({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


_DEFAULTS = {k: v for cls in SECTIONS.values() for k, v in asdict(cls()).items()}


def setting_hints(cls) -> dict:
    """Type hints of a config's settings (TrainConfig: of every section's fields, flat)."""
    if cls is TrainConfig:
        return {k: v for section in SECTIONS.values() for k, v in typing.get_type_hints(section).items()}
    return typing.get_type_hints(cls)


def check_types(cls, values: dict, where: str = "") -> None:
    """ValueError naming the first value whose type does not fit the dataclass field it is for.

    A float field takes an int (1 -> 1.0 is fine), an int field takes no float or bool, a bool field only
    a bool, a str field only a str; Optional fields take None too. Unknown keys are left to the caller."""
    hints = setting_hints(cls)
    for key, value in values.items():
        if key not in hints:
            continue
        allowed = typing.get_args(hints[key]) or (hints[key],)
        if value is None and type(None) in allowed:
            continue
        ok = any((t is float and isinstance(value, (int, float)) and not isinstance(value, bool))
                 or (t is int and isinstance(value, int) and not isinstance(value, bool))
                 or (t in (bool, str) and isinstance(value, t)) for t in allowed)
        if not ok:
            words = {float: "a number", int: "an integer", bool: "true or false", str: "a string",
                     type(None): "unset"}
            names = " or ".join(words.get(t, t.__name__) for t in allowed)
            raise ValueError(f"{where}{key} must be {names}, got {value!r} ({type(value).__name__})")


# settings that may differ between heads trained together in one stack (per-head optimiser values,
# per-head seeds); everything else must be equal within a stack
PER_HEAD = ("lr", "weight_decay", "seed")


def stack_key(cfg: TrainConfig) -> tuple:
    """Heads whose configs share this key can be trained together in one stack. Few-shot heads
    (shots > 0) train on texts their seed draws, so the seed is shared within their stack."""
    per_head = PER_HEAD if not cfg.shots else tuple(k for k in PER_HEAD if k != "seed")
    return tuple((k, v) for k, v in sorted(cfg.to_dict().items()) if k not in per_head)
