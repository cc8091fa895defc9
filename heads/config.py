"""Training settings of a head: a small frozen dataclass of plain values, saved beside every head."""
from __future__ import annotations

import math
import typing
from dataclasses import asdict, dataclass, fields

from headstore.heads.energy import ENERGIES
from headstore.heads.losses import DEFAULT_IMPOSTORS, GRADED_MODES, IMPOSTOR_MODES, LOSS_KINDS, LOSSES, LossConfig

SCHEDULES = ("cosine", "linear", "constant")
PRECISIONS = ("fp32", "bf16")  # head training maths (heads.train): fp32, or bf16 autocast for the matmuls
NORMALIZATIONS = ("none", "center", "l2", "center-l2", "standardize")


@dataclass(frozen=True)
class TrainConfig:
    loss: str = "l1-energy"  # see heads.losses.LOSSES
    energy: str = "l1"  # E(a, b) = ||f(a) - f(b)||_1, the tool's premise; mnr always uses cosine
    lr: float = 3e-3  # AdamW on a small MLP over fixed features; 3e-3 with the 2-layer residual head was SciFact's
    # dev choice (round 2); graded (STS) tables take 1e-3 in train-head (GRADED_DEFAULTS; docs/l1-energy.md)
    weight_decay: float = 0.01  # AdamW's usual decoupled decay
    decay_to_init: float = 0.0  # L2-SP: pull weights toward their initial values (0 = off)
    epochs: int = 15  # few labelled pairs (SciFact: ~800): 15 passes with early stopping on dev (10 for graded
    # tables in train-head: their best epochs are 1-5)
    batch_size: int = 64  # in-batch impostors per anchor = batch_size - 1
    warmup_ratio: float = 0.1  # linear warm-up over the first 10% of steps
    schedule: str = "cosine"  # decay after warm-up: cosine | linear | constant
    grad_clip: float = 1.0  # per-head gradient-norm clip; guards the exp() of the energy loss
    seed: int = 0  # head init, batch order, dropout
    patience: int = 3  # epochs without a dev improvement before a head stops (best epoch is kept)
    mined_k: int = 8  # hard negatives per pair mined by exact NN over the stored corpus (IR; 0 = none):
    # in-batch impostors are too easy on SciFact; 8 beat 0 for every loss and matched 16 (docs/l1-energy.md)
    remine: bool = True  # re-mine hard negatives each epoch in the head's own space (SciFact dev: +0.004 mean)
    normalize: str = "l2"  # features before the head: none | center | l2 | center-l2 | standardize;
    # L2 puts every L1 energy on one scale (~10-20 for MiniLM), so one energy bound Q fits all data
    # loss settings (None = the per-energy default in heads.losses)
    q: float | None = None  # Chopra et al.'s energy bound Q (l1-energy)
    q_start: float | None = None  # a Q schedule: Q goes linearly from q_start to q over training (None: fixed Q)
    tau: float | None = None  # temperature of l1-ce
    margin: float | None = None  # contrastive / triplet margin
    impostors: str = DEFAULT_IMPOSTORS  # which impostors enter the energy losses: the mean over all of them
    # is dominated by easy ones; the hardest / semi-hard one per anchor trains (docs/l1-energy.md)
    genuine_weight: float = 1.0  # genuine vs impostor balance of the energy losses
    precision: str = "fp32"  # matmuls of training and dev selection: fp32 (exact, the reference) or bf16
    # (autocast; fp32 master weights, losses and reductions): ~5x the matmul rate on CPUs with AMX and on
    # GPUs, test metrics within the fp32 run's 95% CI (measured, README); fp32 stays the default so
    # results and head ids of earlier runs do not move
    graded: str = "pearson"  # how graded labels enter l1-energy / contrastive: weight | regress | pearson; pearson
    # is the one form that beats the frozen features on STS-B (the others overfit; docs/l1-energy.md)
    guard: bool = True  # the starting point (the identity head for a residual head) is a selection candidate:
    # a head that never beats it on dev is returned as it (the frozen features), never worse than no head
    # labelled texts (--format labels; heads.label_tasks)
    shots: int = 0  # labelled texts per class drawn with `seed` (few-shot: 8/16/32/64); 0 = every train text
    per_class: int = 4  # K texts per class in a batch of batch_size // K classes: 3 partners per anchor
    hierarchy: bool = False  # targets from the label tree (shared-prefix depth / depth), not same-class only

    def __post_init__(self):
        check_types(type(self), asdict(self))
        checks = [("loss", self.loss, sorted(LOSSES)), ("energy", self.energy, sorted(ENERGIES)),
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
        ]
        for name, holds, what in bounds:
            if not holds:
                raise ValueError(f"{name} must be {what}, got {getattr(self, name)}")
        self.loss_config()  # q, tau, margin, genuine_weight: finite and positive
        if self.q_start is not None and not (math.isfinite(self.q_start) and self.q_start > 0):
            raise ValueError(f"q_start must be a finite number > 0 (or unset: no Q schedule), got {self.q_start}")
        if self.shots < 0 or self.per_class < 2:
            raise ValueError(f"need shots >= 0 and per_class >= 2; got shots={self.shots}, per_class={self.per_class}")

    @property
    def eval_energy(self) -> str:
        """The energy heads are trained and ranked with (mnr is cosine by definition)."""
        return self.energy if LOSS_KINDS[self.loss].uses_energy else "cosine"

    def loss_config(self) -> LossConfig:
        return LossConfig(q=self.q, tau=self.tau, margin=self.margin, impostors=self.impostors,
                          genuine_weight=self.genuine_weight, graded=self.graded)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown training settings {unknown}; valid: {sorted(names)}")
        return cls(**d)


def check_types(cls, values: dict, where: str = "") -> None:
    """ValueError naming the first value whose type does not fit the dataclass field it is for.

    A float field takes an int (1 -> 1.0 is fine), an int field takes no float or bool, a bool field only
    a bool, a str field only a str; Optional fields take None too. Unknown keys are left to the caller."""
    hints = typing.get_type_hints(cls)
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


# train-head's defaults per kind of data where a study chose otherwise than SciFact's (the dataclass
# defaults), for the settings the user leaves unset: graded (STS) tables, a linear residual head at lr 1e-3,
# 10 epochs (docs/l1-energy.md, round 2); labelled texts, the 2-layer head at lr 1e-3, 10 epochs (chosen on
# 20 Newsgroups dev, docs/labels.md)
KIND_DEFAULTS = {"sts": {"depth": 1, "lr": 1e-3, "epochs": 10},
                 "labels": {"depth": 2, "lr": 1e-3, "epochs": 10}}
GRADED_DEFAULTS = KIND_DEFAULTS["sts"]


# settings that may differ between heads trained together in one stack (per-head optimiser values,
# per-head seeds); everything else must be equal within a stack
PER_HEAD = ("lr", "weight_decay", "seed")


def stack_key(cfg: TrainConfig) -> tuple:
    """Heads whose configs share this key can be trained together in one stack. Few-shot heads
    (shots > 0) train on texts their seed draws, so the seed is shared within their stack."""
    per_head = PER_HEAD if not cfg.shots else tuple(k for k in PER_HEAD if k != "seed")
    return tuple((k, v) for k, v in sorted(asdict(cfg).items()) if k not in per_head)
