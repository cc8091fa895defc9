import math

import pytest
import torch

from headstore.heads.scoring.energy import ENERGIES, energy_upper_bound, pairwise_energy


def ref_energy(name, a, b):
    """Loop reference on python floats."""
    a, b = [float(x) for x in a], [float(x) for x in b]
    if name == "l1":
        return sum(abs(x - y) for x, y in zip(a, b))
    if name == "l2":
        return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    dot = sum(x * y for x, y in zip(a, b))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    return 1.0 - dot / (na * nb)


def test_registry_keys():
    assert set(ENERGIES) == {"l1", "l2", "cosine"}


def test_hand_values():
    a = torch.tensor([1.0, 2.0, -1.0])
    b = torch.tensor([0.0, 4.0, 1.0])
    assert ENERGIES["l1"](a, b).item() == pytest.approx(1 + 2 + 2)
    assert ENERGIES["l2"](a, b).item() == pytest.approx(3.0)  # sqrt(1 + 4 + 4), not squared
    # cos = (0 + 8 - 1) / (sqrt 6 * sqrt 17)
    assert ENERGIES["cosine"](a, b).item() == pytest.approx(1 - 7 / math.sqrt(6 * 17), rel=1e-6)


@pytest.mark.parametrize("name", ["l1", "l2", "cosine"])
def test_rowwise_matches_reference_and_broadcasts(name):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g)
    E = ENERGIES[name](a, b)
    assert E.shape == (2, 3)
    for h in range(2):
        for i in range(3):
            assert E[h, i].item() == pytest.approx(ref_energy(name, a[h, i], b[h, i]), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("name", ["l1", "l2", "cosine"])
def test_pairwise_matches_rowwise_with_head_axis(name):
    g = torch.Generator().manual_seed(1)
    H, Q, N, d = 3, 4, 30, 8  # N > 25 exercises cdist's matmul path for l2
    q, docs = torch.randn(H, Q, d, generator=g), torch.randn(H, N, d, generator=g)
    P = pairwise_energy(name, q, docs)
    assert P.shape == (H, Q, N)
    expected = torch.tensor([[[ref_energy(name, q[h, i], docs[h, j]) for j in range(N)]
                              for i in range(Q)] for h in range(H)])
    torch.testing.assert_close(P, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["l1", "l2", "cosine"])
def test_pairwise_broadcasts_shared_docs(name):
    g = torch.Generator().manual_seed(2)
    q, docs = torch.randn(2, 3, 4, generator=g), torch.randn(5, 4, generator=g)
    P = pairwise_energy(name, q, docs)
    assert P.shape == (2, 3, 5)
    for h in range(2):
        torch.testing.assert_close(P[h], pairwise_energy(name, q[h], docs))


@pytest.mark.parametrize("name", ["l1", "l2", "cosine"])
def test_gradient_finite_at_identical_rows(name):
    x = torch.randn(4, 6, requires_grad=True)
    (ENERGIES[name](x, x.detach().clone()).sum() + pairwise_energy(name, x, x.detach().clone()).sum()).backward()
    assert torch.isfinite(x.grad).all()


def test_unknown_energy_lists_options():
    with pytest.raises(ValueError, match="cosine"):
        pairwise_energy("l3", torch.zeros(1, 2), torch.zeros(1, 2))


@pytest.mark.parametrize("name", ["l1", "l2", "cosine"])
def test_upper_bound_holds(name):
    x = torch.randn(20, 5)
    assert pairwise_energy(name, x, x).max().item() <= energy_upper_bound(name, x) + 1e-5


@pytest.mark.parametrize("name", ["l1", "l2", "cosine"])
def test_candidate_energy_is_the_pairwise_energy_of_those_pairs(name):
    from headstore.heads.scoring.energy import candidate_energy

    gen = torch.Generator().manual_seed(0)
    q, d = torch.randn(3, 20, 16, generator=gen), torch.randn(3, 500, 16, generator=gen)  # (H, Q, dim), (H, N, dim)
    cols = torch.randint(0, 500, (20, 7), generator=gen)  # each query's own 7 documents
    got = candidate_energy(name, q, d[:, cols])  # (H, Q, 7)
    want = torch.gather(pairwise_energy(name, q, d), 2, cols.expand(3, -1, -1))
    loop = torch.tensor([[[ENERGIES[name](q[h, i], d[h, j]) for j in cols[i].tolist()] for i in range(20)]
                         for h in range(3)])
    if name == "l1":  # the very numbers of the full ranking: candidates tie and order as it does
        assert torch.equal(got, want)
    assert torch.allclose(got, want, atol=1e-5) and torch.allclose(got, loop, atol=1e-5)
