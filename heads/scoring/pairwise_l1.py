"""The in-batch L1 energy of the training losses with a cheaper backward where few pairs train: `pairwise_l1(q, d)`,
(..., Q, dim), (..., N, dim) -> (..., Q, N), E[..., i, j] = sum_k |q[..., i, k] - d[..., j, k]|: torch.cdist(p=1)'s
numbers and gradients bit for bit (tests/heads/test_pairwise_l1.py).

A loss that keeps one impostor per anchor (the hardest or the semi-hard one: triplet, l1-energy and contrastive on
positive pairs) passes back one nonzero column a row, yet torch's CPU backward walks all Q x N x dim differences,
twice (once per input). When at most 1 / SPARSE_SHARE of the incoming gradient's entries are nonzero, only those
pairs' terms are made (`_sparse`), O(nnz x dim):

    grad_q[i] = sum_j g[i, j] sign(q_i - d_j),    grad_d[j] = -sum_i g[i, j] sign(q_i - d_j),

each sum's terms added in the order torch's kernel adds them (j, resp. i, ascending; its zero terms change no sum).
sign(0) = 0, as in torch's kernel: two equal rows pull on neither side. A dense gradient (l1-ce's softmax) goes to
torch's own backward kernels, and the forward is torch.cdist itself: its scalar loop can be matched bit for bit at half
its CPU time (index_add_ of the dim slices, vectorised over the pairs), but that addition runs on one thread and its
other steps open a parallel region each, which a busy second core stalls (measured 2026-11-29 on 2 cores, one busy:
0.8 s against torch.cdist's 14 ms for 12 x 64 x 64 pairs x 384 dims).
"""
from __future__ import annotations

import torch

SPARSE_SHARE = 8  # the sparse backward when at most 1 / SPARSE_SHARE of the gradient's entries are nonzero


class _PairwiseL1(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, d):
        E = torch.cdist(q, d, p=1.0)
        ctx.save_for_backward(q, d, E)
        return E

    @staticmethod
    def backward(ctx, g):
        q, d, E = ctx.saved_tensors
        g = g.contiguous()
        sparse = int(torch.count_nonzero(g)) * SPARSE_SHARE <= g.numel()
        grads = _sparse(q, d, g) if sparse else _dense(q, d, g, E, ctx.needs_input_grad)
        return tuple(x if need else None for x, need in zip(grads, ctx.needs_input_grad))


def _dense(q, d, g, E, needs):
    """The gradients asked for, by torch's own kernels, as torch.cdist's autograd calls them (its vectorised
    backward is faster than index_add_ over the terms here: measured 11 against 16 ms on the grid's shape)."""
    return (torch.ops.aten._cdist_backward(g, q, d, 1.0, E) if needs[0] else None,
            torch.ops.aten._cdist_backward(g.mT.contiguous(), d, q, 1.0, E.mT.contiguous()) if needs[1] else None)


def _sparse(q, d, g):
    """Both gradients from the signs of the pairs whose incoming gradient is nonzero."""
    l, i, j = g.nonzero(as_tuple=True)  # row-major: i, then j ascending
    terms = torch.sub(q[l, i], d[l, j]).sign_().mul_(g[l, i, j].unsqueeze(-1))  # (nnz, dim)
    gq, gd = torch.zeros_like(q), torch.zeros_like(d)
    gq.index_put_((l, i), terms, accumulate=True)
    gd.index_put_((l, j), terms, accumulate=True)
    return gq, gd.neg_()


def pairwise_l1(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """(..., Q, dim), (..., N, dim) with the same leading axes -> (..., Q, N) L1 distances, torch.cdist's (p=1); the
    backward of this module's doc on the CPU with gradients to compute; elsewhere (no gradient, or a GPU: its own
    kernels) torch.cdist itself."""
    if q.device.type != "cpu" or not (torch.is_grad_enabled() and (q.requires_grad or d.requires_grad)):
        return torch.cdist(q, d, p=1.0)
    lead, (Q, dim), N = q.shape[:-2], q.shape[-2:], d.shape[-2]
    return _PairwiseL1.apply(q.reshape(-1, Q, dim), d.reshape(-1, N, dim)).view(*lead, Q, N)
