"""Losses on head outputs: functions of embeddings and labels, one loss value per head.

Common signature (every loss of `heads.scoring.losses.LOSSES` on pairs):

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

import torch
import torch.nn.functional as F

from headstore.heads.scoring.energy import ENERGIES, check_energy, pairwise_energy
from headstore.heads.scoring.losses import LOSSES
from headstore.heads.scoring.losses.impostors import check_inputs, impostor_energies, select_impostors, weighted_mean
from headstore.heads.scoring.losses.settings import (DEFAULT_MARGIN, DEFAULT_Q, DEFAULT_TAU, LossConfig, cosent_lambda,
                                             pick_default)


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
    labels = check_inputs(name, za, zp, zn, labels, same, LOSSES[name])
    E_pos = ENERGIES[check_energy(energy)](za, zp)  # (H, B)
    E_imp, valid = impostor_energies(za, zp, zn, energy, same, in_batch=labels is None)
    if labels is None:
        if not bool(valid.any()):
            raise ValueError(f"{name}: no impostors in this batch (batch of 1 without negatives, or all "
                             f"pairs marked same); the loss would only pull pairs together")
        pair_term = cfg.genuine_weight * genuine(E_pos).mean(-1)
    else:
        pair_term = _graded_term(E_pos, labels, cfg, genuine, impostor, target_scale)
    if E_imp.shape[-1] == 0:
        return pair_term
    weights = select_impostors(E_imp, valid, E_pos, cfg.impostors)
    return pair_term + weighted_mean(impostor(E_imp), weights)


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
    Labelled texts (label codes) train `heads.scoring.losses.classes.label_energy_loss` instead (the registry's
    "classes" form of l1-energy)."""
    Q = pick_default(cfg.q, DEFAULT_Q, check_energy(energy))
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
    m = pick_default(cfg.margin, DEFAULT_MARGIN, check_energy(energy))
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
    check_inputs("l1-ce", za, zp, zn, labels, same, LOSSES["l1-ce"])
    tau = pick_default(cfg.tau, DEFAULT_TAU, check_energy(energy))
    return _ranking_cross_entropy(za, zp, zn, energy, tau, same)


def mnr_loss(za, zp, zn=None, labels=None, *, energy="l1", cfg=LossConfig(), same=None):
    """Multiple-negatives ranking loss: cross-entropy over cos(a, p) * cfg.scale (20), extra negatives
    zn appended as columns. Always cosine, whatever `energy` says (the sentence-transformers baseline).
    Equal to l1-ce with cosine energy and tau = 1/scale (softmax ignores the constant 1 in 1 - cos)."""
    check_inputs("mnr", za, zp, zn, labels, same, LOSSES["mnr"])
    return _ranking_cross_entropy(za, zp, zn, "cosine", 1.0 / cfg.scale, same)


def cosent_loss(za, zp, zn=None, labels=None, *, energy="l1", cfg=LossConfig(), same=None):
    """CoSENT on energies: log(1 + sum_{(i, j): s_i > s_j} exp(lambda (E_i - E_j))).

    lambda = cfg.scale (20) for cosine energy, whose range is 2; for l1 / l2 it is rescaled by the
    ratio of the energies' typical ranges, cfg.scale * 2 / COSENT_ENERGY_RANGE[energy] (8/3 for l1):
    lambda = 20 on raw L1 distances (tens of units) saturates the softmax and barely trains (measured).
    `cosent_lambda`; it does not depend on l1-energy's Q (`--q` is l1-energy's Q and nothing else).

    Pairs with a higher gold score should have lower energy. Needs labels (graded or 0/1);
    a batch with no ordered pair (all scores equal) gives log(1) = 0."""
    labels = check_inputs("cosent", za, zp, zn, labels, same, LOSSES["cosent"])
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
    check_inputs("triplet", za, zp, zn, labels, same, LOSSES["triplet"])
    m = pick_default(cfg.margin, DEFAULT_MARGIN, check_energy(energy))
    E_pos = ENERGIES[energy](za, zp)  # (H, B)
    E_neg, valid = impostor_energies(za, zp, zn, energy, same, in_batch=zn is None)
    if not bool(valid.any()):
        raise ValueError("triplet: no negatives — give zn (H, B, K, d) or a batch of more than one "
                         "pair whose mismatches are not all marked same")
    mode = cfg.impostors if zn is not None or cfg.impostors == "semi-hard" else "hardest"
    weights = select_impostors(E_neg, valid, E_pos, mode)
    return weighted_mean(F.relu(E_pos.unsqueeze(-1) - E_neg + m), weights)
