"""Distillation losses: a student's energies over each anchor's candidate set matched to a teacher's.

Common signature (every loss of `heads.scoring.losses.DISTILL_LOSSES`):

    loss_fn(E_student, E_teacher, valid=None, *, temperature=1.0) -> (H,)

- E_student: (H, B, C) each student head's energies of B anchors against their C candidates (low = similar);
- E_teacher: (B, C) or (H, B, C) the teacher's energies of the same pairs: fixed targets (no gradient);
- valid: optional (B, C) or (H, B, C) bool, False where a candidate slot is padding (a repeated draw); every
  anchor has at least two valid candidates.

`kl_distill_loss` matches the teacher's distribution over the candidates, softmax(-E / T) (Hinton, Vinyals &
Dean 2015): KL(teacher || student), times T^2 so the gradients keep their scale as T changes.
`margin_mse_loss` matches the teacher's margins (Hofstätter et al. 2020): for each anchor the margin of every
candidate to the teacher's best one (lowest teacher energy), E[j] - E[best], regressed onto the teacher's by
mean squared error. It reads the energies' own scale (no temperature): a student with another energy scale
than its teacher's pays for it, which KL at T forgives only up to a shift.

One loss reads the teacher's embeddings instead of its energies (its spec says `reads="embeddings"`):

    loss_fn(Z_student, Z_teacher, *, spread) -> (H,)

- Z_student: (H, B, d) each student head's outputs of B anchors; Z_teacher: (B, d) or (H, B, d) the teacher's
  (fixed targets), of the same width d;
- spread: the teacher's variance over every anchor of the training set (`teacher_spread`, computed once): a
  property of the data, never of the batch (a batch of one anchor has no variance of its own).

`embedding_mse_loss` regresses the student's outputs onto the teacher's (the MSE distillation of sentence
embeddings, Reimers & Gurevych 2020), as the fraction of the teacher's variance left unexplained:
scale-free, so its weight means the same beside KL and Margin-MSE whatever the teacher's output scale. Outputs
equal up to the energy's own symmetries give equal energies on every pair, so unlike the losses over candidate
sets it also teaches how energies compare across anchors, what a similarity table's Spearman over all pairs reads.
"""
from __future__ import annotations

import torch


def _valid(E: torch.Tensor, valid) -> torch.Tensor:
    return torch.ones_like(E, dtype=torch.bool) if valid is None else valid.expand_as(E)


def kl_distill_loss(E_student: torch.Tensor, E_teacher: torch.Tensor, valid=None, *,
                    temperature: float = 1.0) -> torch.Tensor:
    """T^2 * mean over anchors of KL(p_teacher || p_student), p = softmax(-E / T) over the valid candidates: (H,)."""
    if temperature <= 0:
        raise ValueError(f"temperature {temperature}: must be > 0 (a softmax over -E / T)")
    E_teacher = E_teacher.expand_as(E_student).detach()
    ok = _valid(E_student, valid)
    log_ps = torch.log_softmax((-E_student / temperature).masked_fill(~ok, -torch.inf), dim=-1)
    log_pt = torch.log_softmax((-E_teacher / temperature).masked_fill(~ok, -torch.inf), dim=-1)
    terms = log_pt.exp() * (log_pt - log_ps)  # -inf - -inf at padding: NaN, dropped below
    kl = torch.where(ok, terms, torch.zeros_like(terms)).sum(-1)  # (H, B)
    return kl.mean(-1) * temperature ** 2


def margin_mse_loss(E_student: torch.Tensor, E_teacher: torch.Tensor, valid=None, *,
                    temperature: float = 1.0) -> torch.Tensor:
    """Mean over anchors and their valid candidates (the best one aside) of ((E_s[j] - E_s[best]) -
    (E_t[j] - E_t[best]))^2, best = the teacher's lowest-energy valid candidate: (H,). temperature: unused."""
    E_teacher = E_teacher.expand_as(E_student).detach()
    ok = _valid(E_student, valid)
    best = E_teacher.masked_fill(~ok, torch.inf).argmin(-1, keepdim=True)  # (H, B, 1)
    m_s = E_student - torch.gather(E_student, -1, best)
    m_t = E_teacher - torch.gather(E_teacher, -1, best)
    use = ok.clone()
    use.scatter_(-1, best, False)  # the best against itself: margin 0 on both sides
    sq = torch.where(use, (m_s - m_t) ** 2, torch.zeros_like(m_s))
    return (sq.sum(-1) / use.sum(-1).clamp_min(1)).mean(-1)


def teacher_spread(Z_teacher: torch.Tensor) -> float:
    """The teacher's variance over all its anchors (U, d): mean over anchors of ||z - mean(z)||^2, computed once
    over the whole training set (embedding_mse_loss's normaliser)."""
    Z = Z_teacher.double()
    return float(((Z - Z.mean(0, keepdim=True)) ** 2).sum(-1).mean())


def embedding_mse_loss(Z_student: torch.Tensor, Z_teacher: torch.Tensor, *, spread: float) -> torch.Tensor:
    """mean over anchors of ||Z_s - Z_t||^2, over `spread` (teacher_spread of the whole training set): (H,)."""
    if not spread > 0:
        raise ValueError(f"embedding-mse: the teacher's outputs have no variance over the anchors (spread {spread}): "
                         "every anchor gets the same output, there is nothing to regress onto")
    Z_teacher = Z_teacher.expand_as(Z_student).detach()
    return ((Z_student - Z_teacher) ** 2).sum(-1).mean(-1) / spread
