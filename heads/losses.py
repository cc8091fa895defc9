"""Losses on head outputs: functions of embeddings and labels, one loss value per head.

Common signature (every entry of `LOSSES`):

    loss_fn(za, zp, zn=None, labels=None, *, energy="l1", cfg=LossConfig(), same=None) -> (H,)

- za, zp: (H, B, d) anchor / positive embeddings; row i of za and row i of zp form pair i.
- zn: optional (H, B, K, d) given (or mined) negatives of each anchor.
- labels: optional (B,) float, or (H, B) when the heads of a stack see different batches: 1/0 for
  labelled pairs, a graded score in [0, 1] for STS; None means every pair is a positive (IR pairs).
- same: optional (B, B) or per-head (H, B, B) bool, True where za[i] and zp[j] are known relevant / identical texts;
  those in-batch mismatches are never used as impostors (duplicates must not be pushed apart).
  The diagonal is always the genuine pair.

In-batch impostors of anchor i are zp[j] for j != i with same[i, j] False; given negatives zn[:, i]
are impostors of anchor i too. `cfg.impostors` picks which of them enter the margin/energy losses:
"all" (mean over every impostor), "hardest" (the lowest-energy one per anchor), "semi-hard" (the
lowest-energy impostor that is still farther than the anchor's positive; falls back to the hardest
when none is), "distance-weighted" (every impostor, weighted by the inverse of how common its energy
is in the batch: Wu et al. 2017's distance-weighted sampling taken in expectation, so hard, medium and
easy impostors count alike). The cross-entropy losses (l1-ce, mnr) always use every column.

Graded or 0/1 labels enter the energy losses as `cfg.graded` says: "weight" (the genuine term weighted
by s, the impostor term by 1 - s), "regress" (E regressed onto Q (1 - s)) or "pearson" (E regressed onto
the best affine map of s in the batch: 1 + corr(E, s), free of the energy scale). The pairwise ranking
form on -E is `cosent`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from headstore.heads.energy import ENERGIES, check_energy, pairwise_energy
from headstore.heads.label_losses import label_energy_loss, supcon_kl_loss, supcon_loss

IMPOSTOR_MODES = ("all", "hardest", "semi-hard", "distance-weighted")
GRADED_MODES = ("weight", "regress", "pearson")
DISTANCE_BINS = 16  # histogram bins of the batch's impostor energies (distance-weighted impostors)
# The one default for impostor choice (LossConfig and TrainConfig both use it): the mean over all
# impostors is dominated by easy ones; the semi-hard one per anchor trains (docs/l1-energy.md).
DEFAULT_IMPOSTORS = "semi-hard"

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

    def __post_init__(self):
        if self.impostors not in IMPOSTOR_MODES:
            raise ValueError(f"impostors={self.impostors!r}; valid: {list(IMPOSTOR_MODES)}")
        if self.graded not in GRADED_MODES:
            raise ValueError(f"graded={self.graded!r}; valid: {list(GRADED_MODES)}")
        for name in ("q", "tau", "margin"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number > 0 (or unset for the default), got {value}")
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ValueError(f"scale must be a finite number > 0, got {self.scale}")
        if not (self.genuine_weight >= 0 and math.isfinite(self.genuine_weight)):
            raise ValueError(f"genuine_weight must be a finite number >= 0, got {self.genuine_weight}")

    def resolved(self, energy: str) -> dict[str, float | str]:
        """Every number the losses use under `energy`, defaults filled in (what a head id must hash:
        a default that changes must change the id)."""
        return {"q": _pick(self.q, DEFAULT_Q, energy), "tau": _pick(self.tau, DEFAULT_TAU, energy),
                "margin": _pick(self.margin, DEFAULT_MARGIN, energy), "scale": self.scale,
                "cosent_lambda": cosent_lambda(self.scale, energy), "impostors": self.impostors,
                "genuine_weight": self.genuine_weight, "graded": self.graded}


def _pick(value: Optional[float], defaults: dict[str, float], energy: str) -> float:
    return float(value) if value is not None else defaults[energy]


def cosent_lambda(scale: float, energy: str) -> float:
    """CoSENT's lambda for `energy`: scale per unit of cosine's range, rescaled to this energy's range."""
    return scale * COSENT_ENERGY_RANGE["cosine"] / COSENT_ENERGY_RANGE[check_energy(energy)]


@dataclass(frozen=True)
class LossKind:
    labels: str  # "none": positives only (labels None or all 1) | "optional" | "required" | "classes" (label codes)
    graded: bool  # accepts graded scores in [0, 1] (STS), not just 0/1
    negatives: bool  # uses given / mined negatives zn
    uses_energy: bool  # False: ignores the `energy` argument (mnr is cosine by definition)
    classes: bool = False  # trains on labelled texts: label codes (H, B, L) (heads.label_losses)


# ---------------------------------------------------------------- input checks and impostors


def _check_inputs(name, za, zp, zn, labels, same, kind: LossKind):
    if za.dim() != 3 or za.shape != zp.shape:
        raise ValueError(f"{name}: za and zp must both be (H, B, d); got {tuple(za.shape)}, {tuple(zp.shape)}")
    H, B, d = za.shape
    if zn is not None:
        if not kind.negatives:
            raise ValueError(f"{name} takes no negatives (zn); use one of {[n for n, k in LOSS_KINDS.items() if k.negatives]}")
        if zn.dim() != 4 or zn.shape[:2] != (H, B) or zn.shape[3] != d:
            raise ValueError(f"{name}: zn must be (H, B, K, d) = ({H}, {B}, K, {d}); got {tuple(zn.shape)}")
    if same is not None and (same.shape not in ((B, B), (H, B, B)) or same.dtype != torch.bool):
        raise ValueError(f"{name}: same must be a ({B}, {B}) or ({H}, {B}, {B}) bool mask; "
                         f"got {tuple(same.shape)} {same.dtype}")
    if labels is None:
        if kind.labels == "required":
            raise ValueError(f"{name} needs labels (B,) in [0, 1]")
        return None
    labels = torch.as_tensor(labels, dtype=za.dtype, device=za.device)
    if labels.shape not in ((B,), (H, B)):
        raise ValueError(f"{name}: labels must be ({B},) or ({H}, {B}); got {tuple(labels.shape)}")
    if not bool(((labels >= 0) & (labels <= 1)).all()):
        raise ValueError(f"{name}: labels must lie in [0, 1]; got min {labels.min()} max {labels.max()}")
    if kind.labels == "none":
        if not bool((labels == 1).all()):
            raise ValueError(f"{name} trains on positive pairs only (labels None or all 1); for labelled "
                             f"pairs use one of {[n for n, k in LOSS_KINDS.items() if k.labels != 'none']}")
        return None
    if not kind.graded and not bool(((labels == 0) | (labels == 1)).all()):
        raise ValueError(f"{name} needs 0/1 labels, got graded scores")
    return labels


def _impostor_energies(za, zp, zn, energy, same, in_batch: bool):
    """Energies of every impostor candidate of each anchor and which are valid.

    Returns E (H, B, M) and valid (B, M) or (H, B, M) (per-head `same`) with columns [in-batch zp[j] (B if in_batch), zn[:, i, k] (K)]."""
    H, B, _ = za.shape
    cols, valid = [], []
    if in_batch:
        cols.append(pairwise_energy(energy, za, zp))  # (H, B, B)
        mask = ~torch.eye(B, dtype=torch.bool, device=za.device)
        valid.append(mask if same is None else mask & ~same)
    if zn is not None:
        cols.append(ENERGIES[energy](za.unsqueeze(2), zn))  # (H, B, K)
        valid.append(torch.ones(B, zn.shape[2], dtype=torch.bool, device=za.device))
    if not cols:
        return za.new_zeros(H, B, 0), torch.zeros(B, 0, dtype=torch.bool, device=za.device)
    if any(v.dim() == 3 for v in valid):
        valid = [v.expand(H, B, v.shape[-1]) for v in valid]
    return torch.cat(cols, dim=-1), torch.cat(valid, dim=-1)


def _distance_weights(E_imp, valid) -> torch.Tensor:
    """Weights (H, B, M) of every valid impostor: 1 / (how many of the head's batch impostor energies share
    its histogram bin), normalised to sum 1 per anchor. Each energy range then weighs alike, as if impostors
    were sampled uniformly over distance (Wu et al. 2017) instead of as they come (mostly easy)."""
    E = E_imp.detach()
    valid = valid.expand_as(E)
    weights = torch.zeros_like(E)
    for h in range(E.shape[0]):
        e = E[h][valid[h]]
        if e.numel() == 0:
            continue
        lo, hi = e.min(), e.max()
        width = (hi - lo).clamp_min(torch.finfo(E.dtype).eps) / DISTANCE_BINS
        bins = ((E[h] - lo) / width).floor().clamp(0, DISTANCE_BINS - 1).long()  # (B, M)
        counts = torch.bincount(bins[valid[h]], minlength=DISTANCE_BINS).to(E.dtype)
        weights[h] = valid[h].to(E.dtype) / counts[bins].clamp_min(1.0)
    return weights / weights.sum(-1, keepdim=True).clamp_min(torch.finfo(E.dtype).tiny)


def _select_impostors(E_imp, valid, E_pos, mode: str) -> torch.Tensor:
    """Weights (H, B, M) of the impostors used under `mode` (see module doc): 0/1, or per-anchor
    weights summing to 1 for distance-weighted."""
    weights = valid.to(E_imp.dtype).expand_as(E_imp)
    if mode == "all" or E_imp.shape[-1] == 0:
        return weights
    if mode == "distance-weighted":
        return _distance_weights(E_imp, valid)
    inf = torch.finfo(E_imp.dtype).max
    E = E_imp.detach().masked_fill(~valid, inf)  # (H, B, M)
    if mode == "semi-hard":
        farther = (E > E_pos.detach().unsqueeze(-1)) & valid
        E_semi = E.masked_fill(~farther, inf)
        E = torch.where(farther.any(-1, keepdim=True), E_semi, E)  # fall back to hardest
    one_hot = F.one_hot(E.argmin(-1), E.shape[-1]).to(E_imp.dtype)
    return one_hot * valid.any(-1).to(E_imp.dtype).unsqueeze(-1)  # anchors without impostors: none


def _weighted_mean(values, weights) -> torch.Tensor:
    """Per-head mean of values over entries with weight: (H, ...) -> (H,)."""
    w = weights.flatten(1)
    return (values.flatten(1) * w).sum(-1) / w.sum(-1).clamp_min(1.0)


def pearson_term(E, labels) -> torch.Tensor:
    """1 + corr(E, s) per head: 0 when E is an exact decreasing affine map of s, 2 when increasing.
    E (H, B), labels (B,) or (H, B). A batch whose scores (or energies) are all equal gives 1, no gradient."""
    e = E - E.mean(-1, keepdim=True)
    s = (labels - labels.mean(-1, keepdim=True)).expand_as(e)
    denom = (e.pow(2).sum(-1) * s.pow(2).sum(-1)).sqrt()
    return 1.0 + (e * s).sum(-1) / denom.clamp_min(1e-12)


def _graded_term(E_pos, labels, cfg, genuine, impostor, target_scale):
    """The per-pair part of a labelled batch under cfg.graded (module doc), (H,)."""
    if cfg.graded == "pearson":
        return pearson_term(E_pos, labels)
    if cfg.graded == "regress":  # the genuine term with its target moved from 0 to target_scale (1 - s)
        return cfg.genuine_weight * genuine(E_pos - target_scale * (1 - labels)).mean(-1)
    return (cfg.genuine_weight * labels * genuine(E_pos) + (1 - labels) * impostor(E_pos)).mean(-1)


def _pair_plus_impostor_loss(name, za, zp, zn, labels, energy, cfg, same, genuine, impostor, target_scale):
    """Shared form of l1-energy and contrastive: genuine term on positives, impostor term on impostors.

    Unlabelled: genuine_weight * mean_i genuine(E_ii) + mean over selected impostors impostor(E).
    Labelled (score s_i in [0, 1]), cfg.graded = "weight": mean_i [genuine_weight * s_i * genuine(E_ii) +
    (1 - s_i) * impostor(E_ii)]; "regress": genuine_weight * mean_i genuine(E_ii - T (1 - s_i)) with T the
    energy scale (Q, the margin); "pearson": 1 + corr(E, s). Plus the mean impostor term over given
    negatives zn; no in-batch impostors (the labels say which pairs are impostors)."""
    labels = _check_inputs(name, za, zp, zn, labels, same, LOSS_KINDS[name])
    E_pos = ENERGIES[check_energy(energy)](za, zp)  # (H, B)
    E_imp, valid = _impostor_energies(za, zp, zn, energy, same, in_batch=labels is None)
    if labels is None:
        if not bool(valid.any()):
            raise ValueError(f"{name}: no impostors in this batch (batch of 1 without negatives, or all "
                             f"pairs marked same); the loss would only pull pairs together")
        pair_term = cfg.genuine_weight * genuine(E_pos).mean(-1)
    else:
        pair_term = _graded_term(E_pos, labels, cfg, genuine, impostor, target_scale)
    if E_imp.shape[-1] == 0:
        return pair_term
    weights = _select_impostors(E_imp, valid, E_pos, cfg.impostors)
    return pair_term + _weighted_mean(impostor(E_imp), weights)


# ---------------------------------------------------------------------------- the losses


def l1_energy_loss(za, zp, zn=None, labels=None, *, energy="l1", cfg=LossConfig(), same=None):
    """Chopra, Hadsell & LeCun (2005) energy loss, no partition function and no softmax.

    Genuine pairs: L_G(E) = (2/Q) E^2. Impostor pairs: L_I(E) = 2Q exp(-2.77 E / Q), with Q the
    energy's upper bound (cfg.q, default DEFAULT_Q[energy]). Impostors are in-batch mismatches
    (za[i], zp[j]), j != i and not `same`, plus given/mined negatives zn, chosen by cfg.impostors.
    With labels, pair i contributes s_i * L_G(E_i) + (1 - s_i) * L_I(E_i): label 1 -> genuine,
    0 -> impostor, and a graded STS score s interpolates (genuine weighted by s, impostor by 1 - s);
    cfg.graded = "regress" pulls E toward Q (1 - s) with the genuine term's form, (2/Q) (E - Q (1 - s))^2,
    and "pearson" takes 1 + corr(E, s) over the batch. See `_pair_plus_impostor_loss`.
    Label codes (H, B, L) of labelled texts instead of pair labels: every pair of the batch, weighted by
    Y Yᵀ (heads.label_losses)."""
    if labels is not None and torch.as_tensor(labels).dim() == 3:
        return label_energy_loss(za, zp, zn, labels, energy=energy, cfg=cfg, same=same)
    Q = _pick(cfg.q, DEFAULT_Q, check_energy(energy))
    return _pair_plus_impostor_loss(
        "l1-energy", za, zp, zn, labels, energy, cfg, same,
        genuine=lambda E: (2.0 / Q) * E.pow(2),
        impostor=lambda E: (2.0 * Q) * torch.exp(-2.77 * E / Q),
        target_scale=Q,
    )


def contrastive_loss(za, zp, zn=None, labels=None, *, energy="l1", cfg=LossConfig(), same=None):
    """Margin contrastive loss (Hadsell, Chopra & LeCun 2006): y E^2 / 2 + (1 - y) max(0, m - E)^2 / 2.

    Labelled pairs use their label y (a graded score acts as a soft label). Without labels the
    diagonal pairs have y = 1 and in-batch mismatches / zn have y = 0 (chosen by cfg.impostors).
    m = cfg.margin (default DEFAULT_MARGIN[energy]). Reduction as in `_pair_plus_impostor_loss`."""
    m = _pick(cfg.margin, DEFAULT_MARGIN, check_energy(energy))
    return _pair_plus_impostor_loss(
        "contrastive", za, zp, zn, labels, energy, cfg, same,
        genuine=lambda E: 0.5 * E.pow(2),
        impostor=lambda E: 0.5 * F.relu(m - E).pow(2),
        target_scale=m,
    )


def _ranking_cross_entropy(za, zp, zn, energy, tau, same):
    """Cross-entropy of anchor i picking column i among columns [zp (B), zn flattened (B*K)].

    Logits are -E / tau; every anchor sees every in-batch positive and every given negative
    (as sentence-transformers' MultipleNegativesRankingLoss does); `same` columns are masked out."""
    H, B, d = za.shape
    docs = zp if zn is None else torch.cat([zp, zn.reshape(H, -1, d)], dim=1)  # (H, B + B*K, d)
    logits = -pairwise_energy(energy, za, docs) / tau  # (H, B, B + B*K)
    if same is not None:
        drop = same & ~torch.eye(B, dtype=torch.bool, device=za.device)
        drop = F.pad(drop, (0, logits.shape[-1] - B))  # (B, M) or (H, B, M)
        logits = logits.masked_fill(drop, float("-inf"))
    target = torch.arange(B, device=za.device).expand(H, B)
    return F.cross_entropy(logits.transpose(1, 2), target, reduction="none").mean(-1)


def l1_ce_loss(za, zp, zn=None, labels=None, *, energy="l1", cfg=LossConfig(), same=None):
    """"CE loss via L1": softmax cross-entropy over logits -E/tau, the positive against all in-batch
    positives of other anchors and all given/mined negatives. tau = cfg.tau (default DEFAULT_TAU)."""
    _check_inputs("l1-ce", za, zp, zn, labels, same, LOSS_KINDS["l1-ce"])
    tau = _pick(cfg.tau, DEFAULT_TAU, check_energy(energy))
    return _ranking_cross_entropy(za, zp, zn, energy, tau, same)


def mnr_loss(za, zp, zn=None, labels=None, *, energy="l1", cfg=LossConfig(), same=None):
    """Multiple-negatives ranking loss: cross-entropy over cos(a, p) * cfg.scale (20), extra negatives
    zn appended as columns. Always cosine, whatever `energy` says (the sentence-transformers baseline).
    Equal to l1-ce with cosine energy and tau = 1/scale (softmax ignores the constant 1 in 1 - cos)."""
    _check_inputs("mnr", za, zp, zn, labels, same, LOSS_KINDS["mnr"])
    return _ranking_cross_entropy(za, zp, zn, "cosine", 1.0 / cfg.scale, same)


def cosent_loss(za, zp, zn=None, labels=None, *, energy="l1", cfg=LossConfig(), same=None):
    """CoSENT on energies: log(1 + sum_{(i, j): s_i > s_j} exp(lambda (E_i - E_j))).

    lambda = cfg.scale (20) for cosine energy, whose range is 2; for l1 / l2 it is rescaled by the
    ratio of the energies' typical ranges, cfg.scale * 2 / COSENT_ENERGY_RANGE[energy] (8/3 for l1):
    lambda = 20 on raw L1 distances (tens of units) saturates the softmax and barely trains (measured).
    `cosent_lambda`; it does not depend on l1-energy's Q (`--q` is l1-energy's Q and nothing else).

    Pairs with a higher gold score should have lower energy. Needs labels (graded or 0/1);
    a batch with no ordered pair (all scores equal) gives log(1) = 0."""
    labels = _check_inputs("cosent", za, zp, zn, labels, same, LOSS_KINDS["cosent"])
    E = ENERGIES[check_energy(energy)](za, zp)  # (H, B)
    lam = cosent_lambda(cfg.scale, energy)  # lambda per unit of this energy's range
    diff = lam * (E.unsqueeze(-1) - E.unsqueeze(-2))  # (H, B, B): lambda (E_i - E_j)
    ordered = labels.unsqueeze(-1) > labels.unsqueeze(-2)  # (B, B): s_i > s_j
    diff = diff.masked_fill(~ordered, float("-inf")).flatten(1)
    return torch.logsumexp(torch.cat([diff.new_zeros(diff.shape[0], 1), diff], dim=-1), dim=-1)


def triplet_loss(za, zp, zn=None, labels=None, *, energy="l1", cfg=LossConfig(), same=None):
    """Triplet loss max(0, E(a, p) - E(a, n) + margin), averaged over the chosen negatives.

    With given negatives zn the triplets use them (all of them, or the hardest / semi-hard one per
    anchor per cfg.impostors). Without zn each anchor takes its hardest in-batch impostor
    (semi-hard when cfg.impostors says so). margin = cfg.margin (default DEFAULT_MARGIN[energy])."""
    _check_inputs("triplet", za, zp, zn, labels, same, LOSS_KINDS["triplet"])
    m = _pick(cfg.margin, DEFAULT_MARGIN, check_energy(energy))
    E_pos = ENERGIES[energy](za, zp)  # (H, B)
    E_neg, valid = _impostor_energies(za, zp, zn, energy, same, in_batch=zn is None)
    if not bool(valid.any()):
        raise ValueError("triplet: no negatives — give zn (H, B, K, d) or a batch of more than one "
                         "pair whose mismatches are not all marked same")
    mode = cfg.impostors if zn is not None or cfg.impostors == "semi-hard" else "hardest"
    weights = _select_impostors(E_neg, valid, E_pos, mode)
    return _weighted_mean(F.relu(E_pos.unsqueeze(-1) - E_neg + m), weights)


LossFn = Callable[..., torch.Tensor]

LOSSES: dict[str, LossFn] = {
    "l1-energy": l1_energy_loss,
    "l1-ce": l1_ce_loss,
    "mnr": mnr_loss,
    "contrastive": contrastive_loss,
    "cosent": cosent_loss,
    "triplet": triplet_loss,
    "supcon-kl": supcon_kl_loss,  # labelled texts (heads.label_losses)
    "supcon": supcon_loss,
}

LOSS_KINDS: dict[str, LossKind] = {
    "l1-energy": LossKind(labels="optional", graded=True, negatives=True, uses_energy=True, classes=True),
    "l1-ce": LossKind(labels="none", graded=False, negatives=True, uses_energy=True),
    "mnr": LossKind(labels="none", graded=False, negatives=True, uses_energy=False),
    "contrastive": LossKind(labels="optional", graded=True, negatives=True, uses_energy=True),
    "cosent": LossKind(labels="required", graded=True, negatives=False, uses_energy=True),
    "triplet": LossKind(labels="none", graded=False, negatives=True, uses_energy=True),
    "supcon-kl": LossKind(labels="classes", graded=False, negatives=False, uses_energy=True, classes=True),
    "supcon": LossKind(labels="classes", graded=False, negatives=False, uses_energy=False, classes=True),
}
assert LOSSES.keys() == LOSS_KINDS.keys()


def get_loss(name: str) -> LossFn:
    """The loss called `name`, or ValueError listing the valid names."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; valid losses: {sorted(LOSSES)}")
    return LOSSES[name]
