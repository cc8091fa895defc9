"""Settings of a head: small frozen dataclasses of plain values, saved beside every head (torch-free).

- `HeadConfig`: the head's shape.
- `TrainConfig`: how it is trained, in five sections (heads.settings.train_sections): `OptimConfig`
  (optimiser, schedule, seed, maths), `ObjectiveConfig` (the loss and its constants), `NegativesConfig`
  (mined hard negatives), `SelectionConfig` (choosing the kept weights on dev) and `DataConfig` (how
  training texts are drawn and presented). Every setting has one name across the sections, so on disk
  (config.json "train", grid results columns, head ids) and on the command line the settings stay one flat
  set of plain values: `TrainConfig(lr=1e-3, loss="mnr")`, `cfg.lr`, `cfg.to_dict()`,
  `TrainConfig.from_dict(d)`, `cfg.replace(seed=1)`.
The command-line options of these settings are generated from the fields (heads.settings.options), so a
setting's default, choices and help live here once.
"""
from __future__ import annotations

import math
import typing
from dataclasses import asdict, dataclass, field
from typing import Optional

from headstore.data.errors import SettingError
from headstore.featurize.tuning.schedule import SCHEDULES
from headstore.heads.scoring.losses import LOSSES, LossConfig, scoring_energy
from headstore.heads.scoring.losses.settings import GRADED_MODES, IMPOSTOR_MODES
from headstore.heads.settings.train_sections import (  # noqa: F401  (the sections: importable from here too)
    ENERGY_NAMES, NORMALIZATIONS, PRECISIONS, SECTION_OF, SECTIONS, SOLVERS, DataConfig, NegativesConfig,
    ObjectiveConfig, OptimConfig, SelectionConfig, option_meta)

ACTIVATION_NAMES = ("gelu", "identity", "relu", "tanh")  # heads.network.model implements each
INITS = ("default", "identity")
MIX_MODES = ("scalar", "concat")  # how a head reads several stored arrays (heads.network.model's module doc)
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
KIND_DEPENDENT = ("depth", "lr", "epochs", "anchor_weight", "loss", "normalize", "hidden", "solver",
                  "self_train")  # normalize: also the loss's

# cli grid --test-scope: which heads of a stack are ranked on test (heads.experiments.grid.scope says why)
TEST_SCOPES = ("auto", "all", "selected")


@dataclass(frozen=True)
class HeadConfig:
    depth: int = field(default=2, metadata=option_meta("Linear layers (0 = identity)."))  # 2: SciFact's dev choice
    # (round 2); graded (STS) tables take 1 (heads.kinds.sts)
    hidden: int = field(default=512, metadata={**option_meta(), "kind_help": (
        "train-head's default: 512; a classifier head (ce) on labelled texts 1024 (docs/labels.md); cli grid: 512 "
        "unless set.")})  # width of hidden layers; ~1.3x MiniLM's 384 keeps heads small
    out_dim: Optional[int] = field(default=None, metadata=option_meta())  # None -> in_dim (what a residual head needs)
    activation: str = field(default="gelu", metadata=option_meta(choices=ACTIVATION_NAMES))  # GELU as in the encoder
    dropout: float = field(default=0.0, metadata=option_meta())  # 0: the recipe as measured; masks per head (seeded)
    layer_norm: bool = field(default=False, metadata=option_meta())  # off: features are already pooled
    residual: bool = field(default=True, metadata=option_meta(
        "f(x) = x + g(x), starting exactly at the frozen features (needs out-dim = feature dim)."))
    # g's last layer zero-initialised: training moves away from the baseline only as far as the data asks
    init: str = field(default="default", metadata=option_meta(choices=INITS, cli=False))  # "identity": W = I (depth 1)
    in_dim: Optional[int] = field(default=None, metadata=option_meta(cli=False))  # the store's feature dim, set from it
    mix: int = field(default=1, metadata=option_meta(cli=False))  # arrays mixed into the input (set from --array)
    mix_init: float = field(default=0.8, metadata=option_meta(
        "With --array A+B+...: the starting softmax weight of the first array in the head's layer mix."))
    # near the one-layer head; lower layers add 0.003 Spearman on STS-B dev (docs/l1-energy.md)
    mix_mode: str = field(default="scalar", metadata=option_meta(
        "With --array A+B+...: scalar (a learned softmax mix of the arrays, one array's width into the MLP) or "
        "concat (the arrays side by side into the MLP's first layer; a residual adds back the first array with "
        "--out-dim its width, arrays of several widths (taps); several layers of one width need --no-residual).",
        choices=MIX_MODES))
    # scalar: the small head of docs/l1-energy.md; concat: the distillation student of a tuned encoder keeps 2-3x
    # more of its gain with it (docs/distill.md), at the cost of a first layer L x as wide
    # with --array A+B+... read side by side: drop each array but the first, whole, per text in training, with this
    # probability (the kept ones scaled by 1 / (1 - p)); on STS-B's taps 0.3 lifted dev above frozen + head where
    # the same wide input without it fell below (docs/taps.md)
    array_dropout: float = field(default=0.0, metadata=option_meta(
        "With --array A+B+... read side by side (--mix-mode concat): the probability of dropping each array but the "
        "first, whole, per text in training."))
    # arrays of several widths read side by side (taps): their widths, comma-separated, set from --array
    array_widths: Optional[str] = field(default=None, metadata=option_meta(cli=False))
    sides: str = field(default="both", metadata=option_meta(
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
                  ("mix_init", 0.0 < self.mix_init < 1.0, "in (0, 1)"),
                  ("array_dropout", 0.0 <= self.array_dropout < 1.0, "in [0, 1)")]
        for name, holds, what in bounds:
            if not holds:
                raise SettingError(name, f"must be {what}, got {getattr(self, name)}")
        if self.mix_mode not in MIX_MODES:
            raise ValueError(f"mix_mode={self.mix_mode!r}; valid: {list(MIX_MODES)}")
        if self.sides not in SIDES:
            raise ValueError(f"sides={self.sides!r}; valid: {list(SIDES)}")

    @property
    def out_features(self) -> int:
        """The dimension a head outputs: its input's (input_width: L x D for arrays read side by side) at depth 0
        and under init "identity" (W = I), else out_dim (None: in_dim)."""
        assert self.in_dim is not None
        if self.depth == 0 or self.init == "identity":
            return self.input_width
        return self.in_dim if self.out_dim is None else self.out_dim

    def layer_dims(self) -> list[int]:
        """[in_dim, hidden, ..., out]: depth + 1 sizes (just [in_dim] at depth 0)."""
        assert self.in_dim is not None
        if self.depth == 0:
            return [self.in_dim]
        return [self.input_width] + [self.hidden] * (self.depth - 1) + [self.out_features]

    def array_bounds(self) -> list[int]:
        """[0, w_1, w_1 + w_2, ...]: where each array read side by side starts and ends in the head's input."""
        widths = ([int(w) for w in self.array_widths.split(",")] if self.array_widths
                  else [self.in_dim] * (self.mix if self.mix_mode == "concat" else 1))
        return [sum(widths[:i]) for i in range(len(widths) + 1)]

    @property
    def input_width(self) -> int:
        """The width the MLP's first layer reads: one array's (a scalar mix), or all of them side by side."""
        assert self.in_dim is not None
        return self.in_dim * self.mix if self.mix_mode == "concat" else self.in_dim




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
                  ("schedule", self.schedule, SCHEDULES), ("solver", self.solver, SOLVERS),
                  ("normalize", self.normalize, NORMALIZATIONS),
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
            ("patience", self.patience >= 1, ">= 1 (dev scorings without an improvement before stopping)"),
            ("eval_every", self.eval_every >= 0, ">= 0 (training steps between dev scorings; 0 = auto)"),
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
            ("self_train", self.self_train >= 0, ">= 0 (rounds; 0 = off)"),
            ("self_train_add", self.self_train_add >= 1, ">= 1 (texts per class per round)"),
            ("self_train_c", math.isfinite(self.self_train_c) and self.self_train_c >= 0,
             "a finite number >= 0 (0 = the shots' cross-validated C)"),
        ]
        for name, holds, what in bounds:
            if not holds:
                raise SettingError(name, f"must be {what}, got {getattr(self, name)}")
        self.loss_config()  # q, tau, margin, genuine_weight: finite and positive
        parse_strength(self.strength)

    def check_solver(self) -> None:
        """lbfgs fits a classifier head (its loss ends in the classes); self-training needs lbfgs (and unlabeled
        texts: heads.training.linear_fit says so where there are none). Checked when a head is trained, not when
        the config is made: the kind of data fills in solver and loss after the command line (KIND_DEPENDENT)."""
        if self.solver == "lbfgs" and LOSSES[self.loss].outputs != "classes":
            classifiers = sorted(k for k, v in LOSSES.items() if v.outputs == "classes")
            raise SettingError("solver", f"lbfgs fits a classifier head: needs loss in {classifiers}, "
                                         f"got {self.loss!r} (use --solver adamw)")
        if self.self_train and self.solver != "lbfgs":
            raise SettingError("self_train", f"needs --solver lbfgs, got {self.solver!r}")

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
