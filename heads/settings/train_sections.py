"""The five sections of a head's training settings (`TrainConfig`, heads.settings.config): `OptimConfig`
(optimiser, schedule, seed, maths), `ObjectiveConfig` (the loss and its constants), `NegativesConfig` (mined
hard negatives), `SelectionConfig` (choosing the kept weights on dev) and `DataConfig` (how training texts are
drawn and presented). Small frozen dataclasses of plain values, a comment on why each default (torch-free).

Every field carries the metadata its command-line option is generated from (`option_meta`,
heads.settings.options); a setting name is in one section only (`SECTION_OF`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

from headstore.featurize.tuning.schedule import SCHEDULES
from headstore.heads.scoring.losses import LOSSES
from headstore.heads.scoring.losses.settings import DEFAULT_IMPOSTORS, GRADED_MODES, IMPOSTOR_MODES

SOLVERS = ("adamw", "lbfgs")  # heads.training.train (batches and epochs) / heads.training.linear_fit (a
# depth-1 classifier head fitted as a logistic regression to its optimum)
PRECISIONS = ("fp32", "bf16")  # head training maths (heads.training.train): fp32, or bf16 autocast for the matmuls
NORMALIZATIONS = ("none", "center", "l2", "center-l2", "standardize")
ENERGY_NAMES = ("cosine", "l1", "l2")  # heads.scoring.energy.ENERGIES implements each


def option_meta(help: str = "", choices=None, cli: bool = True, flag: str | None = None):
    """Field metadata the command-line options are generated from (heads.settings.options)."""
    return {"help": help, "choices": choices, "cli": cli, "flag": flag}



@dataclass(frozen=True)
class OptimConfig:
    lr: float = field(default=3e-3, metadata=option_meta())  # AdamW on a small MLP over fixed features; SciFact's dev
    # choice with the 2-layer residual head (round 2); graded tables and labelled texts take 1e-3 (their kinds)
    solver: str = field(default="adamw", metadata={**option_meta(
        "adamw: the head's epochs of mini-batches; lbfgs: a linear classifier head (ce, depth 1) fitted as a "
        "multinomial logistic regression to its optimum, C by cross-validation on the labelled texts.",
        choices=SOLVERS), "kind_help": (
        "train-head's default: lbfgs for a few-shot classifier head (ce with --shots), else adamw; cli grid: adamw "
        "unless set.")})  # adamw: every head; lbfgs: the few-shot classifier (docs/labels.md "Self-training")
    weight_decay: float = field(default=0.01, metadata=option_meta())  # AdamW's usual decoupled decay
    decay_to_init: float = field(default=0.0, metadata=option_meta(
        "L2-SP pull of the weights toward their initial values."))  # 0 = off
    epochs: int = field(default=15, metadata=option_meta("Early stopping on dev either way."))  # few labelled pairs
    # (SciFact ~800): 15 passes with early stopping (graded tables: 10, their best epochs are 1-5)
    batch_size: int = field(default=64, metadata=option_meta())  # in-batch impostors per anchor = batch_size - 1
    schedule: str = field(default="cosine", metadata=option_meta(choices=SCHEDULES))  # decay after the warm-up
    warmup_ratio: float = field(default=0.1, metadata=option_meta())  # linear warm-up over the first 10% of steps
    grad_clip: float = field(default=1.0, metadata=option_meta())  # per-head clip; guards the exp() of the energy loss
    seed: int = field(default=0, metadata=option_meta())  # head init, batch order, dropout
    precision: str = field(default="fp32", metadata=option_meta(
        "Training maths: fp32, or bf16 autocast for the matmuls (fp32 master weights and losses; faster on "
        "CPUs with AMX and on GPUs; emulated and far slower on CPUs without AMX/AVX-512-BF16, which warns).",
        choices=PRECISIONS))  # fp32 stays the default so results and head
    # ids of earlier runs do not move; bf16 test metrics lie within the fp32 run's 95% CI (README). No
    # `auto`: a head's numbers, and a grid's head ids, would then depend on the CPU that trained it (a grid
    # resumed on another machine would train its heads again under other ids)


@dataclass(frozen=True)
class ObjectiveConfig:
    loss: str = field(default="l1-energy", metadata={**option_meta(choices=tuple(sorted(LOSSES))), "kind_help": (
        "train-head's default per kind of data: labelled texts ce (a classifier head, docs/labels.md), other "
        "kinds l1-energy; cli grid: l1-energy unless set.")})  # heads.scoring.losses
    energy: str = field(default="l1", metadata=option_meta(
        "E(a, b) between head outputs (mnr is cosine by definition).", choices=ENERGY_NAMES))  # the premise
    q: Optional[float] = field(default=None, metadata=option_meta(
        "Energy bound Q of l1-energy (default per energy)."))  # None: the per-energy default (heads.scoring.losses)
    tau: Optional[float] = field(default=None, metadata=option_meta("Temperature of l1-ce (default per energy)."))
    margin: Optional[float] = field(default=None, metadata=option_meta(
        "Margin of contrastive/triplet (default per energy)."))
    impostors: str = field(default=DEFAULT_IMPOSTORS, metadata=option_meta(choices=IMPOSTOR_MODES))  # the mean over
    # all impostors is dominated by easy ones; the semi-hard one per anchor trains (docs/l1-energy.md)
    genuine_weight: float = field(default=1.0, metadata=option_meta())  # genuine vs impostor balance
    label_smoothing: float = field(default=0.1, metadata=option_meta(
        "ce: the share of each class target spread evenly over the classes."))  # Szegedy et al. 2016's 0.1
    graded: str = field(default="pearson", metadata=option_meta(
        "How graded (STS) or 0/1 labels enter l1-energy / contrastive: weight (s and 1 - s), regress (E toward "
        "Q (1 - s)), pearson (1 + corr(E, s) per batch).", choices=GRADED_MODES))  # pearson: the one form
    # that beats the frozen features on STS-B (the others overfit; docs/l1-energy.md)
    q_start: Optional[float] = field(default=None, metadata=option_meta(
        "A Q schedule: l1-energy's Q goes linearly from this to --q over training."))  # None: a fixed Q
    anchor_weight: float = field(default=0.0, metadata={**option_meta(
        "Anchor on the unlabeled store: + lambda * mean ||f(x) - x||_1 over store rows that are not training "
        "texts, sampled each step (--anchor-data names the rows)."), "kind_help": (
        "train-head's default per kind of data: IR and positive pairs 2 (docs/robust.md), other kinds 0 "
        "(off); cli grid: 0 unless set.")})  # 0 here (grids, and the ids of their heads, do not move); the
    # IR kind's train-head default is the SciFact study's (heads.kinds.ir, docs/robust.md)


@dataclass(frozen=True)
class NegativesConfig:
    mined_k: int = field(default=8, metadata=option_meta(
        "Hard negatives per pair mined from the stored corpus (IR)."))  # 8 beat 0 for every loss on SciFact
    # and matched 16 (docs/l1-energy.md); 0 = none
    remine: bool = field(default=True, metadata=option_meta(
        "Re-mine hard negatives each epoch in the head's own space."))  # SciFact dev: +0.004 mean
    remine_every: int = field(default=1, metadata=option_meta(
        "With --remine: re-mine in head space at epochs N, 2N, ... (the negatives of the last re-mine in between)."))
    # 1: every epoch, what the studies measured; on a large corpus a re-mine of a stack of H heads embeds H x
    # every pooled document (~200k at 1M documents), so N trades the negatives' freshness for time
    exact_max: int = field(default=20_000, metadata=option_meta(
        "Largest corpus (documents) searched exactly for mining and dev ranking; above it, candidates: each "
        "query's frozen top --pool-k (an exact cosine search, done once), re-scored in head space each epoch."))
    # 20,000: SciFact (5k) and corpora of its size keep the exact search and their numbers; above ~20k an
    # exact re-mine + dev ranking per epoch costs more than the epoch's training steps (bench/scale/scale_heads.py)
    pool_k: int = field(default=100, metadata=option_meta(
        "Candidates per query above --exact-max: the frozen space's top-k documents."))  # 100: 12x the 8
    # mined negatives; the dev candidates' share of the exact top-10 is reported in metrics.json

    def on_candidates(self, n_docs: int) -> bool:
        """Whether a corpus of `n_docs` documents is mined and dev-ranked on candidates (above exact_max)."""
        return n_docs > self.exact_max


@dataclass(frozen=True)
class SelectionConfig:
    patience: int = field(default=3, metadata=option_meta(
        "Dev scorings without an improvement before a head stops (one scoring an epoch unless an epoch is long: "
        "--eval-every)."))  # 3 epochs; within a long epoch 3 x N steps, counted after the warm-up
    eval_every: int = field(default=0, metadata=option_meta(
        "Score dev every N training steps, early stopping counting these scorings. 0 = auto: once an epoch when it "
        "has at most 512 steps, else every N steps from the plan's cost model (about 10% of the time on scoring; "
        "said on the terminal and in metrics.json)."))  # auto: an epoch of 100 k judged pairs (1,700 steps) is
    # scored ~27 times and a head that cannot gain stops within a few hundred steps after the warm-up (issue 58)
    guard: bool = field(default=True, metadata=option_meta(
        "Keep the starting point (the identity head) as a candidate: a head that never beats it on dev is "
        "returned as it; a head worse than the frozen features is reported."))  # never worse than no head
    strength: str = field(default="1", metadata=option_meta(
        "Strength a of the trained update, after training: f_a(x) = x + a g(x) for a residual head (other "
        "heads: a of the way from their starting weights). A number in [0, 1], or 'auto': chosen on dev (the "
        "in-domain dev split and the --select-ood sets, the rule in docs/robust.md)."))  # 1: the trained head as
    # it is (earlier heads and figures do not move); the study's choice is in docs/robust.md


@dataclass(frozen=True)
class DataConfig:
    normalize: str = field(default="l2", metadata={**option_meta(choices=NORMALIZATIONS), "kind_help": (
        "train-head's default: l2; standardize for a classifier head (ce), whose MLP learns slowly on unit-norm "
        "rows; cli grid: l2 unless set.")})  # features before the head: L2
    # puts every L1 energy on one scale (~10-20 for MiniLM), so one energy bound Q fits all data
    shots: int = field(default=0, metadata=option_meta(
        "Labelled texts: texts per class drawn with --seed (few-shot); 0 = all of train."))
    per_class: int = field(default=4, metadata=option_meta(
        "Labelled texts: K texts per class in a batch of batch-size // K classes."))  # 3 partners per anchor
    hierarchy: bool = field(default=False, metadata=option_meta(
        "Labelled texts: targets from the label tree (shared-prefix depth / depth)."))
    self_train: int = field(default=0, metadata={**option_meta(
        "Labelled texts with --shots: rounds of self-training over the train texts whose labels the shots hide "
        "(each round pseudo-labels the most confident --self-train-add x round texts per class and refits); "
        "needs --solver lbfgs. 0 = off."), "kind_help": (
        "train-head's default: 5 for a classifier head (ce) on up to 16 shots, else 0; cli grid: 0 unless set.")})
    # 0 here (grids and the ids of their heads do not move); the labels kind's few-shot default is 5 (20 Newsgroups
    # dev, docs/labels.md "Self-training")
    self_train_add: int = field(default=64, metadata=option_meta(
        "With --self-train: pseudo-labelled texts added per class per round (round r holds r x this many)."))
    # 64: 20 Newsgroups dev, 8 and 16 shots, +1 point over 32 at 5 rounds (docs/labels.md "Self-training")
    self_train_c: float = field(default=10.0, metadata=option_meta(
        "With --self-train: C of the rounds' refits (on the shots and the pseudo-labelled texts); 0 = the C the "
        "shots' cross-validation chose."))  # 10: 20 Newsgroups dev, 3 seeds, 5 x 64: 0.702 vs 0.683 for the CV's C
    # at 16 shots (its C = 0.1 or 1 on two seeds holds the pseudo-labels back), 0.680 vs 0.680 at 8; 100: 0.701, 0.674
    anchor_data: str = field(default="", metadata=option_meta(
        "With --anchor-weight: a dataset whose texts in the store are the anchor rows (training texts left "
        "out, and its dev and test texts); empty = the task's own: its --unlabeled texts, else its corpus."))
    # the task's own texts, never the whole store: a head must not depend on what else shares its store (issue 54)


SECTIONS = {"optimizer": OptimConfig, "objective": ObjectiveConfig, "negatives": NegativesConfig,
            "selection": SelectionConfig, "data": DataConfig}
SECTION_OF = {f.name: name for name, cls in SECTIONS.items() for f in fields(cls)}  # setting -> its section
assert len(SECTION_OF) == sum(len(fields(c)) for c in SECTIONS.values()), "a setting name is in two sections"
