"""The in-batch L1 energy of the training losses, cheaper on a CPU: `pairwise_l1(q, d)`, (..., Q, dim), (..., N, dim)
-> (..., Q, N), E[..., i, j] = sum_k |q[..., i, k] - d[..., j, k]|, torch.cdist(p=1)'s numbers and gradients bit for
bit (tests/heads/test_pairwise_l1.py).

- The forward (`_distances`): torch's CPU kernel adds a pair's |q_k - d_k| one k after the other in a scalar loop;
  here the same additions in the same order, each vectorised over a block of pairs (index_add_ of dim slices).
- The backward when few pairs train (`_sparse`): a loss that keeps one impostor per anchor (the hardest or the
  semi-hard one: triplet, l1-energy and contrastive on positive pairs) passes back one nonzero column a row, yet
  torch's backward walks all Q x N x dim differences, twice (once per input). When at most 1 / SPARSE_SHARE of the
  incoming gradient's entries are nonzero, only those pairs' signs are made, O(nnz x dim):

      grad_q[i] = sum_j g[i, j] sign(q_i - d_j),    grad_d[j] = -sum_i g[i, j] sign(q_i - d_j),

  each sum's terms added in the order torch's kernel adds them (j, resp. i, ascending; its zero terms change no sum).
  sign(0) = 0, as in torch's kernel: two equal rows pull on neither side. A dense gradient (l1-ce's softmax) goes to
  torch's own backward kernels.
"""
from __future__ import annotations

import torch

SPARSE_SHARE = 8  # the sparse backward when at most 1 / SPARSE_SHARE of the gradient's entries are nonzero
BLOCK = 1 << 21  # differences (dim x rows x N) made at a time: 8 MB in fp32


class _PairwiseL1(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, d):
        E = _distances(q, d)
        ctx.save_for_backward(q, d, E)
        return E

    @staticmethod
    def backward(ctx, g):
        q, d, E = ctx.saved_tensors
        g = g.contiguous()
        sparse = int(torch.count_nonzero(g)) * SPARSE_SHARE <= g.numel()
        grads = _sparse(q, d, g) if sparse else _dense(q, d, g, E, ctx.needs_input_grad)
        return tuple(x if need else None for x, need in zip(grads, ctx.needs_input_grad))


def _distances(q, d):
    """torch.cdist(q, d, p=1)'s numbers, bit for bit, in half its time on a CPU: its kernel adds a pair's |q_k - d_k|
    one k after the other in a scalar loop; here a block of rows' differences is laid out (dim, rows, N) and
    index_add_ adds its dim slices one after the other into a zero row, each addition vectorised over all the block's
    pairs: the same additions in the same order."""
    L, Q, dim = q.shape
    N = d.shape[1]
    qT, dT = q.detach().transpose(1, 2).contiguous(), d.detach().transpose(1, 2).contiguous()  # (L, dim, Q), (L, dim, N)
    out = q.new_zeros(L, Q, N)
    first = torch.zeros(dim, dtype=torch.long, device=q.device)  # every slice into row 0
    rows = max(1, BLOCK // max(1, dim * N))
    for l in range(L):
        for r in range(0, Q, rows):
            diff = torch.sub(qT[l, :, r:r + rows, None], dT[l, :, None, :]).abs_()  # (dim, rows, N)
            out[l, r:r + rows].view(1, -1).index_add_(0, first, diff.view(dim, -1))
    return out


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
