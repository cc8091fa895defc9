"""A stack's training settings resolved once, at the door: `resolve_stack(configs)` -> `ResolvedTraining`.

A TrainConfig holds the settings as given (after the task kind's defaults, heads.training.kind_defaults), where
a derived value is left to be worked out: the energy heads are ranked with (a loss that ignores `energy` ranks
with cosine), the loss's constants (None: the loss's per-energy default), the Q schedule's end, the strength as
a string ("auto" or a number), and which settings a stack's heads share. `resolve_stack` works them out once
(checking the stack shares what it must and that the solver fits the loss), into plain values every room below
the door reads and none derives again: heads.training.train (the stack's loop), batches (data, negatives,
losses), optim (the schedule and per-head rates), tracker (dev scores), anchor (the anchor's sample), the task
kinds' dev candidates (heads.kinds.ir, given the `negatives` section) and train-head's reports
(heads.training.run).

Two values stay open, because the data decides them: `eval_every` 0 (auto: the plan's cost model once the
epoch's steps are known, heads.training.cost.scoring_interval) and whether a corpus is mined and dev-ranked on
candidates (`on_candidates`: its size against exact_max).

The settings as given stay beside the resolved ones (`settings`): each head's run record carries its own
(HeadRun.config: config.json "train", grid results' columns, head ids), so what is saved does not change.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from headstore.heads.scoring.losses import LossConfig
from headstore.heads.settings.config import TrainConfig, parse_strength, stack_key
from headstore.heads.settings.train_sections import NegativesConfig


@dataclass(frozen=True)
class ResolvedTraining:
    """Every training setting of one stack of heads, resolved (plain values; per-head ones as tuples)."""

    settings: tuple[TrainConfig, ...]  # each head's settings as given: its run record (module doc), read by no room
    lrs: tuple[float, ...]  # per head: AdamW's peak rate
    weight_decays: tuple[float, ...]  # per head: AdamW's decoupled decay
    seeds: tuple[int, ...]  # per head: init, batch order, mined negatives, the anchor's sample
    solver: str  # adamw (the loop in heads.training.train) | lbfgs (heads.training.linear_fit)
    loss: str  # a key of heads.scoring.losses.LOSSES
    energy: str  # E(a, b) the loss is given (cosine, l1, l2)
    eval_energy: str  # the energy heads are ranked, mined and scored with (scoring_energy(loss, energy))
    loss_config: LossConfig  # the loss's constants as given (None: its per-energy default, resolved by the loss)
    q_schedule: Optional[tuple[float, float]]  # (Q at the first step, Q at the last): --q-start to --q (or the
    # energy's default Q); None: a fixed Q
    normalize: str  # the features' normaliser before the head (heads.network.features.Normalizer)
    precision: str  # fp32 | bf16 (autocast for the matmuls)
    epochs: int
    batch_size: int  # as given: a stack trains on min(batch_size, training pairs)
    schedule: str  # the lr schedule after the warm-up
    warmup_ratio: float
    grad_clip: float  # 0: no clipping
    decay_to_init: float  # 0: off
    anchor_weight: float  # 0: the anchor is off
    negatives: NegativesConfig  # mined_k, remine, remine_every, exact_max, pool_k: plain values already
    patience: int  # dev scorings without an improvement before a head stops
    eval_every: int  # steps between dev scorings; 0: auto, once the epoch's steps are known (module doc)
    guard: bool  # the starting point is a candidate on dev
    strength_setting: str  # --strength as given ("1": the head as trained; metrics.json "strength" says it)
    strength: Optional[float]  # the a applied after training; None: auto, chosen on dev (heads.training.strength)

    @property
    def n_heads(self) -> int:
        return len(self.settings)

    @property
    def adjusts_strength(self) -> bool:
        """Whether a strength other than the trained head's is applied, or chosen, after training."""
        return self.strength_setting != "1"

    def q_at(self, step: int, total: int) -> Optional[float]:
        """l1-energy's Q at update `step` of `total` under the Q schedule: linearly from its start to its end over
        training; None without a schedule (the loss takes loss_config's q)."""
        if self.q_schedule is None:
            return None
        start, end = self.q_schedule
        return start + (end - start) * min(1.0, step / max(1, total - 1))


def resolve_stack(configs: list[TrainConfig] | tuple[TrainConfig, ...]) -> ResolvedTraining:
    """The settings of a stack of heads (`configs`, one per head, sharing heads.settings.config.stack_key) resolved
    once; a ValueError for a stack that mixes shared settings or a solver its loss cannot take."""
    configs = tuple(configs)
    if not configs:
        raise ValueError("a stack needs at least one head's settings")
    if len({stack_key(c) for c in configs}) != 1:
        raise ValueError("a stack mixes settings that must be shared (all but "
                         "heads.settings.config.PER_HEAD: lr, weight_decay, seed)")
    cfg = configs[0]
    cfg.check_solver()
    loss_config = cfg.loss_config()
    q_schedule = None
    if cfg.q_start is not None:  # toward --q, or the energy's default Q where --q is unset
        q_schedule = (cfg.q_start, loss_config.resolved(cfg.energy)["q"])
    return ResolvedTraining(
        settings=configs, lrs=tuple(c.lr for c in configs), weight_decays=tuple(c.weight_decay for c in configs),
        seeds=tuple(c.seed for c in configs), solver=cfg.solver, loss=cfg.loss, energy=cfg.energy,
        eval_energy=cfg.eval_energy, loss_config=loss_config, q_schedule=q_schedule, normalize=cfg.normalize,
        precision=cfg.precision, epochs=cfg.epochs, batch_size=cfg.batch_size, schedule=cfg.schedule,
        warmup_ratio=cfg.warmup_ratio, grad_clip=cfg.grad_clip, decay_to_init=cfg.decay_to_init,
        anchor_weight=cfg.anchor_weight, negatives=cfg.negatives, patience=cfg.patience,
        eval_every=cfg.eval_every, guard=cfg.guard, strength_setting=cfg.strength,
        strength=parse_strength(cfg.strength))



def as_plan(configs: ResolvedTraining | list[TrainConfig] | tuple[TrainConfig, ...]) -> ResolvedTraining:
    """A stack's resolved settings: `configs` as they are when resolved at a door (train-head), else resolved here
    from the heads' settings (a caller holding TrainConfigs: grid's stacks, comparisons, studies, tests)."""
    return configs if isinstance(configs, ResolvedTraining) else resolve_stack(configs)
