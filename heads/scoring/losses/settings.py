"""The loss constants and `LossConfig` (torch-free: the command line and the config read them without torch).

Per-energy defaults fill a `LossConfig` field left unset; `LossConfig.resolved` lists every number a loss
uses, defaults filled in, which is what a head id hashes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from headstore.data.errors import SettingError

IMPOSTOR_MODES = ("all", "hardest", "semi-hard", "distance-weighted")
GRADED_MODES = ("weight", "regress", "pearson")
DISTANCE_BINS = 16  # histogram bins of the batch's impostor energies (distance-weighted impostors)
# The one default for impostor choice (LossConfig and TrainConfig both use it): the mean over all
# impostors is dominated by easy ones; the semi-hard one per anchor trains (docs/l1-energy.md).
DEFAULT_IMPOSTORS = "semi-hard"
CLASSES = "classes"  # the "energy" of a classifier head (loss ce): its own class scores (heads.scoring.losses)

# Per-energy defaults used when the LossConfig field is None. Energies live on different scales:
# cosine energy is bounded by 2; L1 energies of L2-normalised 384-d MiniLM features are ~10-20
# (a plain 256-d MLP head at PyTorch init gives ~5 for similar and ~13 for random pairs); l2 is
# ~10x smaller than l1. Heads can rescale their outputs, so these set the starting operating point.
# l1: 15 for L2-normalised MiniLM features under a residual head (the defaults), where impostor energies
# are ~10-20: the impostor term 2Q exp(-2.77 E/Q) still bends there. Q = 50 (above every energy) makes the
# push linear in E and the head falls below the frozen baseline (measured; docs/l1-energy.md).
DEFAULT_Q = {"l1": 15.0, "l2": 4.0, "cosine": 2.0}
DEFAULT_TAU = {"l1": 1.0, "l2": 0.1, "cosine": 0.05}  # logit gap pos vs impostor ~5-10 at init
DEFAULT_MARGIN = {"l1": 16.0, "l2": 1.0, "cosine": 0.5}  # ~ typical impostor energy at init
# CoSENT's lambda per unit of energy: cfg.scale (20) on cosine energy, whose range is 2, rescaled by each
# energy's typical range (l1 15, l2 4 on L2-normalised MiniLM features), i.e. scale * 2 / range. Its own
# constants: CoSENT must not move when another loss's default (DEFAULT_Q of l1-energy) is retuned.
COSENT_ENERGY_RANGE = {"l1": 15.0, "l2": 4.0, "cosine": 2.0}


@dataclass(frozen=True)
class LossConfig:
    # Chopra et al.'s Q: the energy's upper bound. Impostor pushes fade once E >> Q (exp(-2.77 E/Q))
    # and the genuine pull is 4E/Q, so energies settle on the scale of Q. None -> DEFAULT_Q[energy].
    q: Optional[float] = None
    # temperature of l1-ce logits -E/tau; for unnormalised energies it only sets the starting
    # sharpness (a head can rescale). None -> DEFAULT_TAU[energy] (cosine 0.05 = mnr's scale 20).
    tau: Optional[float] = None
    # similarity scale of mnr (cos * 20, the sentence-transformers default) and CoSENT's lambda.
    scale: float = 20.0
    # margin of contrastive and triplet losses. None -> DEFAULT_MARGIN[energy].
    margin: Optional[float] = None
    # which impostors enter l1-energy / contrastive / triplet: "all" | "hardest" | "semi-hard".
    impostors: str = DEFAULT_IMPOSTORS
    # weight of the genuine (positive pair) term against the impostor term; 1 = the paper's sum.
    genuine_weight: float = 1.0
    # how graded / 0-1 labels enter l1-energy and contrastive: "weight" | "regress" | "pearson" (module doc)
    graded: str = "weight"
    # ce: the share of each target spread evenly over the classes (Szegedy et al. 2016's 0.1)
    label_smoothing: float = 0.1
    # ce: sizes of the consecutive output blocks that get one softmax each (a label tree's levels); () = one.
    # Set from the data (heads.kinds.labels), never by a user
    groups: tuple[int, ...] = ()

    def __post_init__(self):
        if self.impostors not in IMPOSTOR_MODES:
            raise ValueError(f"impostors={self.impostors!r}; valid: {list(IMPOSTOR_MODES)}")
        if self.graded not in GRADED_MODES:
            raise ValueError(f"graded={self.graded!r}; valid: {list(GRADED_MODES)}")
        for name in ("q", "tau", "margin"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise SettingError(name, f"must be a finite number > 0 (or unset for the default), got {value}")
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise SettingError("scale", f"must be a finite number > 0, got {self.scale}")
        if not (self.genuine_weight >= 0 and math.isfinite(self.genuine_weight)):
            raise SettingError("genuine_weight", f"must be a finite number >= 0, got {self.genuine_weight}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise SettingError("label_smoothing", f"must be in [0, 1), got {self.label_smoothing}")

    def resolved(self, energy: str) -> dict[str, float | str]:
        """Every number the losses use under `energy`, defaults filled in (what a head id must hash:
        a default that changes must change the id). A classifier head's (energy CLASSES) are ce's alone."""
        if energy == CLASSES:  # no energy, so no energy's constants
            return {"q": None, "tau": None, "margin": None, "label_smoothing": self.label_smoothing}
        return {"q": pick_default(self.q, DEFAULT_Q, energy), "tau": pick_default(self.tau, DEFAULT_TAU, energy),
                "margin": pick_default(self.margin, DEFAULT_MARGIN, energy), "scale": self.scale,
                "cosent_lambda": cosent_lambda(self.scale, energy), "impostors": self.impostors,
                "genuine_weight": self.genuine_weight, "graded": self.graded}


def pick_default(value: Optional[float], defaults: dict[str, float], energy: str) -> float:
    return float(value) if value is not None else defaults[energy]


def cosent_lambda(scale: float, energy: str) -> float:
    """CoSENT's lambda for `energy`: scale per unit of cosine's range, rescaled to this energy's range."""
    return scale * COSENT_ENERGY_RANGE["cosine"] / COSENT_ENERGY_RANGE[_energy(energy)]


def _energy(name: str) -> str:
    if name not in COSENT_ENERGY_RANGE:
        raise ValueError(f"unknown energy {name!r}; valid energies: {sorted(COSENT_ENERGY_RANGE)}")
    return name
