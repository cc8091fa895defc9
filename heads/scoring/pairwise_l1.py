"""The in-batch L1 energy of the training losses with a cheaper backward where few pairs train: `pairwise_l1(q, d)`,
(..., Q, dim), (..., N, dim) -> (..., Q, N), E[..., i, j] = sum_k |q[..., i, k] - d[..., j, k]|.

The forward is torch.cdist(p=1) itself (the same numbers bit for bit). A loss that keeps one impostor per anchor (the
hardest or the semi-hard one: triplet, l1-energy and contrastive on positive pairs) passes back a gradient with one
nonzero column a row, yet torch's CPU backward walks all Q x N x dim differences, twice (once per input). Here, when at
most 1 / SPARSE_SHARE of the incoming gradient's entries are nonzero, only those pairs' signs are made (`_sparse`):
O(nnz x dim),

    grad_q[i] = sum_j g[i, j] sign(q_i - d_j),    grad_d[j] = -sum_i g[i, j] sign(q_i - d_j),

each sum's terms added in the order torch's kernel adds them (j, resp. i, ascending; its zero terms change no sum), so
the gradients are torch's to the bit (tests/heads/test_pairwise_l1.py). sign(0) = 0, as in torch's kernel: two equal
rows pull on neither side. A dense gradient (l1-ce's softmax) goes to torch's own backward kernels, as before.
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
    """The gradients asked for, by torch's own kernels, as torch.cdist's autograd calls them."""
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
