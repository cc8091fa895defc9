import math

import pytest
import torch
import torch.nn as nn

from headstore.heads.settings.config import HeadConfig
from headstore.heads.network.model import StackedMLP, load_heads, save_heads


def cfg(**kw):
    base = dict(in_dim=6, hidden=5, out_dim=4, residual=False)
    base.update(kw)
    return HeadConfig(**base)


def reference_forward(model, h, x):
    """Head h as plain nn.Linear layers + torch activations, built from the stacked parameters."""
    c = model.cfg
    act = {"gelu": nn.GELU(), "relu": nn.ReLU(), "tanh": nn.Tanh(), "identity": nn.Identity()}[c.activation]
    out = x
    for l in range(c.depth):
        lin = nn.Linear(*model.weights[l].shape[1:])
        with torch.no_grad():
            lin.weight.copy_(model.weights[l][h].T)
            lin.bias.copy_(model.biases[l][h])
        out = lin(out)
        if l < c.depth - 1:
            if c.layer_norm:
                ln = nn.LayerNorm(c.hidden)
                with torch.no_grad():
                    ln.weight.copy_(model.ln_weights[l][h])
                    ln.bias.copy_(model.ln_biases[l][h])
                out = ln(out)
            out = act(out)
    return x + out if c.residual else out


@pytest.mark.parametrize("depth,out", [(0, 6), (1, 4), (2, 4), (3, 4)])
def test_shapes_shared_and_per_head_input(depth, out):
    m = StackedMLP(3, cfg(depth=depth))
    assert m.out_features == out
    assert m(torch.randn(7, 6)).shape == (3, 7, out)
    assert m(torch.randn(3, 7, 6)).shape == (3, 7, out)
    assert sum(p.numel() for p in m.parameters()) == (0 if depth == 0 else 3 * sum(
        a * b + b for a, b in zip(m.cfg.layer_dims()[:-1], m.cfg.layer_dims()[1:])))
    with pytest.raises(ValueError, match="input must be"):
        m(torch.randn(2, 7, 6))


@pytest.mark.parametrize("kw", [dict(), dict(activation="relu", layer_norm=True, depth=3),
                                dict(activation="tanh", depth=1), dict(residual=True, out_dim=6, activation="identity")])
def test_stacked_forward_equals_per_head_reference(kw):
    m = StackedMLP(3, cfg(**kw), seeds=[3, 1, 4])
    with torch.no_grad():  # make residual / layer-norm parameters non-trivial
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(5, 6)
    y = m(x)
    xs = torch.randn(3, 5, 6)
    ys = m(xs)
    for h in range(3):
        torch.testing.assert_close(y[h], reference_forward(m, h, x))
        torch.testing.assert_close(ys[h], reference_forward(m, h, xs[h]))


def test_head_seed_reproduces_single_head_and_slice():
    c = cfg(depth=2, layer_norm=True)
    stack = StackedMLP(3, c, seeds=[10, 20, 30])
    for h, s in enumerate([10, 20, 30]):
        single = StackedMLP(1, c, seeds=[s])
        for (n, p), (n2, q) in zip(stack.named_parameters(), single.named_parameters()):
            assert n == n2 and torch.equal(p[h:h + 1], q)
        sliced = stack.head_slice(h)
        assert sliced.seeds == [s]
        x = torch.randn(4, 6)
        torch.testing.assert_close(sliced(x)[0], stack(x)[h])
    assert not torch.equal(stack.weights[0][0], stack.weights[0][1])  # different seeds, different heads


def test_default_init_distribution_matches_nn_linear_bound():
    m = StackedMLP(2, HeadConfig(in_dim=400, hidden=300, out_dim=200, residual=False))
    for w, fan_in in zip(m.weights, [400, 300]):
        bound = 1 / math.sqrt(fan_in)
        assert w.abs().max() <= bound and w.abs().max() > 0.98 * bound
        assert abs(w.std().item() - bound / math.sqrt(3)) < 0.02 * bound


@pytest.mark.parametrize("kw", [dict(residual=True, out_dim=6, depth=2), dict(residual=True, out_dim=None, depth=1),
                                dict(init="identity", depth=1, out_dim=6), dict(depth=0)])
def test_identity_starts_return_input_exactly(kw):
    m = StackedMLP(2, cfg(**kw))
    x = torch.randn(9, 6)
    y = m(x)
    assert torch.equal(y[0], x) and torch.equal(y[1], x)


def test_config_errors():
    with pytest.raises(ValueError, match="out_dim == in_dim"):
        StackedMLP(1, cfg(residual=True, out_dim=4))
    with pytest.raises(ValueError, match="identity"):
        StackedMLP(1, cfg(init="identity", depth=2, out_dim=6))
    with pytest.raises(ValueError, match="in_dim"):
        StackedMLP(1, HeadConfig())
    with pytest.raises(ValueError, match="gelu"):
        HeadConfig(activation="swish")
    with pytest.raises(ValueError, match="one seed per head"):
        StackedMLP(2, cfg(), seeds=[1])


def test_dropout_only_in_training():
    m = StackedMLP(2, cfg(dropout=0.5))
    x = torch.randn(8, 6)
    m.eval()
    torch.testing.assert_close(m(x), m(x))
    m.train()
    assert not torch.allclose(m(x), m(x))


def test_safetensors_round_trip(tmp_path):
    c = cfg(depth=2, layer_norm=True, activation="tanh")
    m = StackedMLP(3, c, seeds=[5, 6, 7])
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p))
    path = tmp_path / "heads.safetensors"
    save_heads(path, m, c)
    back = load_heads(path)
    assert back.cfg == c and back.seeds == [5, 6, 7] and back.n_heads == 3
    x = torch.randn(4, 6)
    assert torch.equal(back(x), m(x))
    (tmp_path / "other.safetensors").write_bytes(b"")
    with pytest.raises(Exception):
        load_heads(tmp_path / "other.safetensors")
