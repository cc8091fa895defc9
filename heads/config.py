"""Training settings of a head: a small frozen dataclass of plain values, saved beside every head."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from headstore.heads.energy import ENERGIES
from headstore.heads.losses import IMPOSTOR_MODES, LOSS_KINDS, LOSSES, LossConfig

SCHEDULES = ("cosine", "linear", "constant")
NORMALIZATIONS = ("none", "center", "l2", "center-l2", "standardize")


@dataclass(frozen=True)
class TrainConfig:
    loss: str = "l1-energy"  # see heads.losses.LOSSES
    energy: str = "l1"  # E(a, b) = ||f(a) - f(b)||_1, the tool's premise; mnr always uses cosine
    lr: float = 1e-3  # AdamW on a small MLP over fixed features: 1e-3 converges in a few epochs
    weight_decay: float = 0.01  # AdamW's usual decoupled decay
    decay_to_init: float = 0.0  # L2-SP: pull weights toward their initial values (0 = off)
    epochs: int = 10  # few labelled pairs (SciFact: ~800): 10 passes with early stopping on dev
    batch_size: int = 64  # in-batch impostors per anchor = batch_size - 1
    warmup_ratio: float = 0.1  # linear warm-up over the first 10% of steps
    schedule: str = "cosine"  # decay after warm-up: cosine | linear | constant
    grad_clip: float = 1.0  # per-head gradient-norm clip; guards the exp() of the energy loss
    seed: int = 0  # head init, batch order, dropout
    patience: int = 3  # epochs without a dev improvement before a head stops (best epoch is kept)
    mined_k: int = 8  # hard negatives per pair mined by exact NN over the stored corpus (IR; 0 = none):
    # in-batch impostors are too easy on SciFact; 8 beat 0 for every loss and matched 16 (docs/l1-energy.md)
    remine: bool = False  # re-mine hard negatives each epoch in the head's own space
    normalize: str = "l2"  # features before the head: none | center | l2 | center-l2 | standardize;
    # L2 puts every L1 energy on one scale (~10-20 for MiniLM), so one energy bound Q fits all data
    # loss settings (None = the per-energy default in heads.losses)
    q: float | None = None  # Chopra et al.'s energy bound Q (l1-energy)
    tau: float | None = None  # temperature of l1-ce
    margin: float | None = None  # contrastive / triplet margin
    impostors: str = "semi-hard"  # which impostors enter the energy losses: the mean over all of them is
    # dominated by easy ones; the hardest / semi-hard one per anchor trains (docs/l1-energy.md)
    genuine_weight: float = 1.0  # genuine vs impostor balance of the energy losses
    # labelled texts (--format labels; heads.label_tasks)
    shots: int = 0  # labelled texts per class drawn with `seed` (few-shot: 8/16/32/64); 0 = every train text
    per_class: int = 4  # K texts per class in a batch of batch_size // K classes: 3 partners per anchor
    hierarchy: bool = False  # targets from the label tree (shared-prefix depth / depth), not same-class only

    def __post_init__(self):
        checks = [("loss", self.loss, sorted(LOSSES)), ("energy", self.energy, sorted(ENERGIES)),
                  ("schedule", self.schedule, SCHEDULES), ("normalize", self.normalize, NORMALIZATIONS),
                  ("impostors", self.impostors, IMPOSTOR_MODES)]
        for name, value, valid in checks:
            if value not in valid:
                raise ValueError(f"{name}={value!r}; valid: {list(valid)}")
        if self.epochs < 1 or self.batch_size < 2 or self.lr <= 0 or self.mined_k < 0:
            raise ValueError(f"need epochs >= 1, batch_size >= 2, lr > 0, mined_k >= 0; got {self}")
        if self.shots < 0 or self.per_class < 2:
            raise ValueError(f"need shots >= 0 and per_class >= 2; got shots={self.shots}, per_class={self.per_class}")

    @property
    def eval_energy(self) -> str:
        """The energy heads are trained and ranked with (mnr is cosine by definition)."""
        return self.energy if LOSS_KINDS[self.loss].uses_energy else "cosine"

    def loss_config(self) -> LossConfig:
        return LossConfig(q=self.q, tau=self.tau, margin=self.margin, impostors=self.impostors,
                          genuine_weight=self.genuine_weight)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown training settings {unknown}; valid: {sorted(names)}")
        return cls(**d)


# settings that may differ between heads trained together in one stack (per-head optimiser values,
# per-head seeds); everything else must be equal within a stack
PER_HEAD = ("lr", "weight_decay", "seed")


def stack_key(cfg: TrainConfig) -> tuple:
    """Heads whose configs share this key can be trained together in one stack. Few-shot heads
    (shots > 0) train on texts their seed draws, so the seed is shared within their stack."""
    per_head = PER_HEAD if not cfg.shots else tuple(k for k in PER_HEAD if k != "seed")
    return tuple((k, v) for k, v in sorted(asdict(cfg).items()) if k not in per_head)
