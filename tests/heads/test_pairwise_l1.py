"""heads.scoring.pairwise_l1: the in-batch L1 energy's cheaper backward against independent references (the plain
broadcast |q_i - d_j| summed, and its autograd gradient), and against torch.cdist's own numbers."""
import pytest
import torch

from headstore.heads.scoring import pairwise_l1 as module
from headstore.heads.scoring.energy import pairwise_energy
from headstore.heads.scoring.losses import get_loss
from headstore.heads.scoring.losses.settings import LossConfig


def _broadcast(q, d):
    return (q.unsqueeze(-2) - d.unsqueeze(-3)).abs().sum(-1)


def _grads(fn, q, d, g):
    q, d = q.detach().clone().requires_grad_(), d.detach().clone().requires_grad_()
    E = fn(q, d)
    return (E.detach(), *torch.autograd.grad(E, (q, d), g))


def _inputs(seed, lead=(3,), Q=9, N=11, dim=7, ties=True):
    gen = torch.Generator().manual_seed(seed)
    q, d = torch.randn(*lead, Q, dim, generator=gen), torch.randn(*lead, N, dim, generator=gen)
    if ties:  # equal rows (sign 0 on every dim) and equal single entries
        d[..., 2, :] = q[..., 4, :]
        d[..., 5, 3] = q[..., 1, 3]
    return q, d


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("lead", [(), (1,), (3,), (2, 3)])
def test_values_and_gradients_match_the_broadcast_reference(sparse, lead):
    q, d = _inputs(1, lead)
    g = torch.randn(*lead, 9, 11, generator=torch.Generator().manual_seed(2))
    if sparse:  # one column a row: the hardest-impostor losses' gradient
        g = g * torch.nn.functional.one_hot(g.abs().argmax(-1), 11)
    E, gq, gd = _grads(module.pairwise_l1, q, d, g)
    E_ref, gq_ref, gd_ref = _grads(_broadcast, q, d, g)
    torch.testing.assert_close(E, E_ref, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(gq, gq_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gd, gd_ref, rtol=1e-6, atol=1e-6)
    assert float(gq.abs().sum()) > 0 and float(gd.abs().sum()) > 0


def test_equal_rows_pull_on_neither_side():
    """sign(0) = 0: a query equal to a document gets no gradient from that pair (torch.cdist's convention)."""
    q = torch.tensor([[[1.0, 2.0, 3.0]]])
    d = torch.tensor([[[1.0, 2.0, 3.0], [0.0, 2.0, 5.0]]])
    g = torch.tensor([[[1.0, 0.0]]])  # only the equal pair
    _, gq, gd = _grads(module.pairwise_l1, q, d, g)
    assert torch.equal(gq, torch.zeros_like(q)) and torch.equal(gd, torch.zeros_like(d))
    g = torch.tensor([[[0.5, 2.0]]])
    _, gq, gd = _grads(module.pairwise_l1, q, d, g)
    assert torch.equal(gq, torch.tensor([[[2.0, 0.0, -2.0]]]))
    assert torch.equal(gd, torch.tensor([[[0.0, 0.0, 0.0], [-2.0, 0.0, 2.0]]]))


@pytest.mark.parametrize("sparse", [False, True])
def test_a_training_shape_equals_torch_cdist_bit_for_bit(sparse):
    """The grid's in-batch shape (12 heads, 64 pairs, 384 dims): values and both gradients are torch.cdist's own, the
    sparse backward's too (its sums add the nonzero terms in torch's order)."""
    q, d = _inputs(3, (12,), 64, 64, 384)
    g = torch.randn(12, 64, 64, generator=torch.Generator().manual_seed(4))
    if sparse:
        g = g * torch.nn.functional.one_hot(g.argmin(-1), 64)
    for ours, theirs in zip(_grads(module.pairwise_l1, q, d, g), _grads(lambda a, b: torch.cdist(a, b, p=1.0), q, d, g)):
        assert torch.equal(ours, theirs)


def test_one_side_without_gradient_and_no_grad_mode():
    q, d = _inputs(7)
    qg = q.clone().requires_grad_()
    E = module.pairwise_l1(qg, d)  # documents fixed
    E.sum().backward()
    torch.testing.assert_close(qg.grad, torch.sign(q.unsqueeze(-2) - d.unsqueeze(-3)).sum(-2))
    with torch.no_grad():
        assert module.pairwise_l1(qg, d).grad_fn is None


@pytest.mark.parametrize("loss", ["l1-ce", "triplet", "l1-energy"])
def test_a_loss_trains_as_through_torch_cdist(loss, monkeypatch):
    """The in-batch losses' gradients through pairwise_energy equal those through plain torch.cdist."""
    gen = torch.Generator().manual_seed(8)
    za, zp = torch.randn(4, 16, 24, generator=gen), torch.randn(4, 16, 24, generator=gen)
    same = torch.zeros(16, 16, dtype=torch.bool)
    same[3, 5] = True

    def grads():
        a, p = za.clone().requires_grad_(), zp.clone().requires_grad_()
        get_loss(loss, "positives")(a, p, None, None, energy="l1", cfg=LossConfig(), same=same).sum().backward()
        return a.grad, p.grad

    ours = grads()
    monkeypatch.setattr(module, "_PairwiseL1", type("Plain", (), {"apply": staticmethod(
        lambda a, b: torch.cdist(a, b, p=1.0))}))
    for a, b in zip(ours, grads()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert pairwise_energy("l1", za, zp).shape == (4, 16, 16)
