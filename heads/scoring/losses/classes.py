"""Losses on labelled texts: functions of a batch's embeddings and its label codes.

Same signature as the pair losses (heads.scoring.losses.pairs), with class labels (the registry's `classes` form):

    loss_fn(za, zp, zn=None, labels=Y, *, energy="l1", cfg=LossConfig(), same=None) -> (H,)

- za, zp: (H, B, d), two views of the same B texts (in headstore both are the head's output of the
  text: a labelled-text task trains on anchor = positive). Text i of za is compared with every text
  j != i of zp: `E[i, j] = energy(za[i], zp[j])`.
- labels: Y, (B, L) or (H, B, L) label codes (`heads.kinds.labels`): `S = Y Yᵀ` is the similarity of
  two texts' labels, 1 for the same class, 0 for unrelated ones, the shared-prefix share of the
  tree's depth for relatives when the codes are hierarchical.
- same: optional (B, B) / (H, B, B) bool, True where two batch entries are the same text (a class
  with fewer than K texts repeats some): those pairs are left out, as is the diagonal.

`supcon-kl` (the research note's loss): `p_i = softmax_j(-E[i, j] / tau)` over j != i, target
`T_i = S[i] / sum_j S[i, j]` (the row-normalised `Y Yᵀ`), loss = mean_i KL(T_i || p_i). Any energy;
L1 by default, tau = cfg.tau or DEFAULT_TAU[energy].
`supcon` (Khosla et al. 2020, L_out): cosine similarity of the L2-normalised outputs over tau
(cfg.tau or 0.1, the paper's value), loss_i = -sum_p T_ip log softmax_j(sim_ij / tau)_p, i.e.
-1/|P(i)| sum over the positives p of i — the same target weighting, so with hierarchical codes
relatives are partial positives. Since KL(T || p) = CE(T, p) - H(T), `supcon-kl` with cosine energy
equals `supcon` minus the targets' entropy (a constant): the two differ in the energy, not the form.
Anchors without any partner in the batch (S[i, j] = 0 for every j != i) are left out of both.

`label_energy_loss` (Chopra, Hadsell & LeCun 2005 on label pairs; `l1-energy` on labelled texts):
every pair (i, j != i) of the batch is genuine with weight S[i, j] and impostor with weight
1 - S[i, j] (hierarchy-weighted: relatives are partly both). Loss = genuine_weight *
sum S L_G(E) / sum S + sum w L_I(E) / sum w, with L_G(E) = (2/Q) E^2, L_I(E) = 2Q exp(-2.77 E/Q), and
w = (1 - S) on the impostors cfg.impostors picks ("all"; "hardest" / "semi-hard": one per anchor
among pairs with S < 1, relative to the anchor's mean genuine energy).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from headstore.heads.scoring.energy import check_energy, pairwise_energy
from headstore.heads.scoring.losses.impostors import select_impostors
from headstore.heads.scoring.losses.settings import DEFAULT_Q, DEFAULT_TAU, LossConfig, pick_default

SUPCON_TAU = 0.1  # Khosla et al.'s temperature for cosine similarities of normalised embeddings


def label_similarity(labels: torch.Tensor) -> torch.Tensor:
    """S = Y Yᵀ: (B, L) -> (1, B, B), (H, B, L) -> (H, B, B)."""
    Y = labels if labels.dim() == 3 else labels.unsqueeze(0)
    return Y @ Y.transpose(-1, -2)


def _inputs(name: str, za, zp, labels, same) -> tuple[torch.Tensor, torch.Tensor]:
    """(S (H, B, B), pair mask (H, B, B) of the pairs that count: j != i and not `same`)."""
    if za.dim() != 3 or za.shape != zp.shape:
        raise ValueError(f"{name}: za and zp must both be (H, B, d); got {tuple(za.shape)}, {tuple(zp.shape)}")
    H, B, _ = za.shape
    if labels is None:
        raise ValueError(f"{name} needs label codes Y (B, L) or (H, B, L) of labelled texts (--format labels)")
    labels = torch.as_tensor(labels, dtype=za.dtype, device=za.device)
    if labels.dim() not in (2, 3) or labels.shape[-2] != B or (labels.dim() == 3 and labels.shape[0] != H):
        raise ValueError(f"{name}: labels must be label codes ({B}, L) or ({H}, {B}, L); got {tuple(labels.shape)}")
    mask = ~torch.eye(B, dtype=torch.bool, device=za.device)
    if same is not None:
        if same.dtype != torch.bool or same.shape not in ((B, B), (H, B, B)):
            raise ValueError(f"{name}: same must be a ({B}, {B}) or ({H}, {B}, {B}) bool mask; got {tuple(same.shape)}")
        mask = mask & ~same
    S = label_similarity(labels).expand(H, B, B)
    return S, mask.expand(H, B, B)


def _pick_tau(cfg, energy: str) -> float:
    return float(cfg.tau) if cfg.tau is not None else DEFAULT_TAU[energy]


def _soft_cross_entropy(logits, S, mask, with_entropy: bool) -> torch.Tensor:
    """Mean over anchors with a target of sum_j T_ij (log T_ij [if with_entropy] - log p_ij); (H,)."""
    T = S * mask
    rowsum = T.sum(-1, keepdim=True)  # (H, B, 1)
    has = rowsum.squeeze(-1) > 0  # (H, B) anchors with at least one partner
    T = T / rowsum.clamp_min(1e-12)
    logp = torch.log_softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
    terms = -T * logp.masked_fill(~mask, 0.0)
    if with_entropy:
        terms = terms + torch.where(T > 0, T * torch.log(T.clamp_min(1e-30)), torch.zeros_like(T))
    per_anchor = terms.sum(-1)  # (H, B)
    return (per_anchor * has).sum(-1) / has.sum(-1).clamp_min(1)


def supcon_kl_loss(za, zp, zn=None, labels=None, *, energy="l1", cfg=None, same=None):
    """KL(row-normalised Y Yᵀ || softmax(-E / tau)) per anchor, averaged (module doc)."""
    cfg = cfg or LossConfig()
    S, mask = _inputs("supcon-kl", za, zp, labels, same)
    logits = -pairwise_energy(check_energy(energy), za, zp) / _pick_tau(cfg, energy)  # (H, B, B)
    return _soft_cross_entropy(logits, S, mask, with_entropy=True)


def supcon_loss(za, zp, zn=None, labels=None, *, energy="l1", cfg=None, same=None):
    """Supervised contrastive loss (Khosla et al. 2020, L_out) on cosine similarities / tau; ignores `energy`."""
    cfg = cfg or LossConfig()
    S, mask = _inputs("supcon", za, zp, labels, same)
    tau = float(cfg.tau) if cfg.tau is not None else SUPCON_TAU
    logits = F.normalize(za, dim=-1) @ F.normalize(zp, dim=-1).transpose(-1, -2) / tau
    return _soft_cross_entropy(logits, S, mask, with_entropy=False)


def label_energy_loss(za, zp, zn=None, labels=None, *, energy="l1", cfg=None, same=None):
    """Chopra et al.'s energy loss on every pair of a labelled batch, weighted by S (module doc)."""
    cfg = cfg or LossConfig()
    if zn is not None:
        raise ValueError("l1-energy on labelled texts takes no negatives (zn): the batch's other classes are the impostors")
    S, mask = _inputs("l1-energy", za, zp, labels, same)
    Q = pick_default(cfg.q, DEFAULT_Q, check_energy(energy))
    E = pairwise_energy(energy, za, zp)  # (H, B, B)
    genuine_w = S * mask
    genuine = (genuine_w * (2.0 / Q) * E.pow(2)).flatten(1).sum(-1) / genuine_w.flatten(1).sum(-1).clamp_min(1e-12)
    impostor = mask & (S < 1 - 1e-6)
    if not bool(impostor.any()):
        raise ValueError("l1-energy: no impostor pair in this batch (every text shares one class); "
                         "a labelled batch needs at least two classes")
    E_gen = (genuine_w * E).sum(-1) / genuine_w.sum(-1).clamp_min(1e-12)  # (H, B) mean genuine energy per anchor
    chosen = select_impostors(E, impostor, E_gen, cfg.impostors)  # (H, B, B) 0/1
    weights = (chosen * (1 - S).clamp_min(0)).flatten(1)
    impostor_term = ((2.0 * Q) * torch.exp(-2.77 * E / Q)).flatten(1)
    return cfg.genuine_weight * genuine + (weights * impostor_term).sum(-1) / weights.sum(-1).clamp_min(1e-12)
