"""The one loss registry: every loss, what data it accepts, and its functions (torch-free).

A loss is a function of a batch's embeddings and its targets (heads.scoring.losses.pairs, heads.scoring.losses.classes):

    loss_fn(za, zp, zn=None, labels=None, *, energy="l1", cfg=LossConfig(), same=None) -> (H,)

Each entry declares the *forms of training data* it accepts, one of which every task kind produces
(heads.kinds): `positives` (relevant pairs only: IR qrels, positives-only tables), `binary` (pairs
labelled 0/1), `graded` (pairs with a score in [0, 1]: STS) and `classes` (labelled texts: label codes).
`applicable(loss, form)` is the one check of whether a loss can train on a kind of data, used by
train-head, grid and finetune alike. `objective(loss, form, graded, negatives)` names what a loss trains on a
data form: two losses that reduce to the same objective there (`LossSpec.reduces_to`: under `--graded
pearson` on graded or 0/1 pairs without negatives, l1-energy and contrastive both train 1 + corr(E, s)) train
identical heads, so a grid trains such heads once. A loss that takes positive pairs only trains on labelled or graded
data through its genuine pairs (label >= GENUINE_THRESHOLD).

Functions are named as "module:function" and imported on first use, so this registry (and the command
line's choices) needs no torch.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from headstore.heads.scoring.losses.settings import CLASSES, LossConfig  # noqa: F401  (re-exported)

FORMS = ("positives", "binary", "graded", "classes")  # what a task kind trains on (heads.kinds)
PAIR_FORMS = ("positives", "binary", "graded")
# graded / labelled pairs given to a loss that takes positive pairs only (mnr, l1-ce, triplet): keep the
# pairs whose label is at least this (STS score >= 4 of 5, "mostly equivalent"; 1 for 0/1 labels)
GENUINE_THRESHOLD = 0.8


@dataclass(frozen=True)
class LossSpec:
    name: str
    accepts: tuple[str, ...]  # the data forms it trains on (FORMS)
    negatives: bool  # uses given / mined negatives zn
    uses_energy: bool  # False: ignores the `energy` argument (cosine by definition: mnr, supcon)
    pairs_fn: str = ""  # "module:function" of heads.scoring.losses for the pair forms
    classes_fn: str = ""  # ... for labelled texts (label codes)
    # (form, graded mode, objective): on data of `form` under `--graded` mode, with no negatives given or mined
    # (their impostor terms are the losses' own), the loss is that objective and nothing else of it counts
    reduces_to: tuple[tuple[str, str, str], ...] = ()
    outputs: str = "embedding"  # what its head outputs: an embedding compared by an energy, or "classes" (scores)
    normalize: str = ""  # its input normalisation where the user gives none ("": the setting's default, l2)

    def function(self, form: str = "positives") -> Callable:
        """The loss function for data of `form` (a pair form or `classes`)."""
        ref = self.classes_fn if form == "classes" else self.pairs_fn
        if not ref:
            raise ValueError(applicable(self.name, form) or f"loss {self.name} has no function for {form!r}")
        module, name = ref.split(":")
        return getattr(importlib.import_module(f"headstore.heads.scoring.losses.{module}"), name)

    def __call__(self, *args, **kwargs):
        """The loss on pairs (`function(form)` for labelled texts)."""
        return self.function("classes" if not self.pairs_fn else "positives")(*args, **kwargs)


# heads.scoring.losses.pairs: labelled pairs under graded="pearson" enter l1-energy and contrastive as pearson_term alone
PEARSON = "1 + corr(E, s) over the batch"
PEARSON_FORMS = (("graded", "pearson", PEARSON), ("binary", "pearson", PEARSON))

LOSSES: dict[str, LossSpec] = {spec.name: spec for spec in (
    LossSpec("l1-energy", ("positives", "binary", "graded", "classes"), negatives=True, uses_energy=True,
             pairs_fn="pairs:l1_energy_loss", classes_fn="classes:label_energy_loss", reduces_to=PEARSON_FORMS),
    LossSpec("l1-ce", ("positives",), negatives=True, uses_energy=True, pairs_fn="pairs:l1_ce_loss"),
    LossSpec("mnr", ("positives",), negatives=True, uses_energy=False, pairs_fn="pairs:mnr_loss"),
    LossSpec("contrastive", ("positives", "binary", "graded"), negatives=True, uses_energy=True,
             pairs_fn="pairs:contrastive_loss", reduces_to=PEARSON_FORMS),
    LossSpec("cosent", ("binary", "graded"), negatives=False, uses_energy=True, pairs_fn="pairs:cosent_loss"),
    LossSpec("triplet", ("positives",), negatives=True, uses_energy=True, pairs_fn="pairs:triplet_loss"),
    LossSpec("supcon-kl", ("classes",), negatives=False, uses_energy=True, classes_fn="classes:supcon_kl_loss"),
    LossSpec("supcon", ("classes",), negatives=False, uses_energy=False, classes_fn="classes:supcon_loss"),
    # ce standardises: an MLP on unit-norm MiniLM rows (entries ~0.05) learns slowly at lr 1e-3 (docs/labels.md)
    LossSpec("ce", ("classes",), negatives=False, uses_energy=False, classes_fn="ce:ce_loss", outputs="classes",
             normalize="standardize"),
)}


COSINE = "cosine"  # the energy of a loss that ignores the `energy` setting (mnr, supcon: cosine by definition)


def scoring_energy(loss: str, energy: str) -> str:
    """The energy heads trained with `loss` under the `energy` setting are trained, selected, ranked, souped
    and ensembled with: the setting itself, or cosine for a loss that ignores it (`uses_energy` False). The
    one rule (TrainConfig.eval_energy, soups, ensembles). A classifier head's is `CLASSES` (module doc)."""
    if LOSSES[loss].outputs == "classes":
        return CLASSES
    return energy if LOSSES[loss].uses_energy else COSINE


def losses_that(test: Callable[[LossSpec], bool]) -> list[str]:
    """Names of the losses whose spec passes `test`, sorted (for messages listing the valid ones)."""
    return sorted(name for name, spec in LOSSES.items() if test(spec))


def get_loss(name: str, form: str = "positives") -> Callable:
    """The function of loss `name` for data of `form`, or ValueError listing the valid names."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; valid losses: {sorted(LOSSES)}")
    return LOSSES[name].function(form)


def applicable(loss: str, form: str, task: str = "the data", kind: str = "") -> str:
    """Why `loss` cannot train on data of `form` ("" when it can); `task` and `kind` name the dataset and its
    task kind in the message.

    Labelled texts train only the losses that take class labels and class losses need labelled texts; a
    loss that needs labels refuses positives-only data; positives-only losses train on the genuine pairs of
    labelled or graded data."""
    spec = LOSSES[loss]
    if form in spec.accepts or (form in ("binary", "graded") and "positives" in spec.accepts):
        return ""
    if form == "classes":
        return f"loss {loss} trains on pairs; for labelled texts use one of {CLASS_LOSSES_HINT}"
    if spec.accepts == ("classes",):
        return f"loss {loss} needs labelled texts (--format labels); {task} is a {kind!r} dataset"
    return f"loss {loss} needs graded or labelled pairs; {task} has positives only"


def objective(loss: str, form: str, graded: str, negatives: bool) -> str:
    """What `loss` trains on data of `form` under `--graded` mode `graded`: the objective it reduces to there
    (LossSpec.reduces_to) when no negatives enter the batches (`negatives`: given or mined ones do), else the
    loss's own name. Losses with the same objective (and every other setting alike) train the same heads."""
    if not negatives:
        for spec_form, spec_graded, name in LOSSES[loss].reduces_to:
            if (spec_form, spec_graded) == (form, graded):
                return name
    return loss


CLASS_LOSSES_HINT = ", ".join(losses_that(lambda spec: "classes" in spec.accepts))  # the losses on labelled texts


@dataclass(frozen=True)
class DistillLossSpec:
    """A distillation loss (heads.scoring.losses.distill): a function of the student's energies over each anchor's
    candidate set and the teacher's energies of the same pairs (the targets), one value per head; or, where
    `reads` is "embeddings", of the student's and the teacher's outputs of the anchors."""

    name: str
    fn: str  # "module:function" of heads.scoring.losses
    temperature: bool  # reads the temperature (a softmax over -E / T)
    reads: str = "energies"  # energies: over candidate sets; embeddings: the anchors' outputs

    def function(self) -> Callable:
        module, name = self.fn.split(":")
        return getattr(importlib.import_module(f"headstore.heads.scoring.losses.{module}"), name)


DISTILL_LOSSES: dict[str, DistillLossSpec] = {spec.name: spec for spec in (
    DistillLossSpec("kl", "distill:kl_distill_loss", temperature=True),  # Hinton, Vinyals & Dean 2015
    DistillLossSpec("margin-mse", "distill:margin_mse_loss", temperature=False),  # Hofstätter et al. 2020
    DistillLossSpec("embedding-mse", "distill:embedding_mse_loss", temperature=False,
                    reads="embeddings"),  # Reimers & Gurevych 2020
)}
DISTILL_SEPARATOR = "+"  # "kl+margin-mse": the sum of both


def distill_losses(name: str) -> list[DistillLossSpec]:
    """The losses `name` sums ("kl", "margin-mse", "kl+margin-mse"), or ValueError listing the valid names."""
    parts = name.split(DISTILL_SEPARATOR)
    if not name or any(p not in DISTILL_LOSSES for p in parts) or len(set(parts)) != len(parts):
        raise ValueError(f"distillation loss {name!r}; valid: {sorted(DISTILL_LOSSES)} or their sum joined by "
                         f"{DISTILL_SEPARATOR!r}, e.g. kl+margin-mse")
    return [DISTILL_LOSSES[p] for p in parts]
