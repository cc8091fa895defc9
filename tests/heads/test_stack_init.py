"""A stack's initial weights (heads.network.model._init_stack: drawn into the stacked tensors) equal, bit for bit, the
one-head-at-a-time draws the stack was built from before (each head from its own generator: per layer weight then
bias, (U[0, 1) * 2 - 1) / sqrt(fan_in), a residual head's last layer 0, init "identity" W = I)."""
import math

import pytest
import torch

from headstore.heads.network.model import StackedMLP
from headstore.heads.settings.config import HeadConfig


def _one_head(cfg: HeadConfig, seed: int):
    gen = torch.Generator().manual_seed(seed)
    dims = cfg.layer_dims()
    layers = []
    for fan_in, fan_out in zip(dims[:-1], dims[1:]):
        bound = 1.0 / math.sqrt(fan_in)
        w = (torch.rand(fan_in, fan_out, generator=gen) * 2 - 1) * bound
        b = (torch.rand(fan_out, generator=gen) * 2 - 1) * bound
        layers.append((w, b))
    if cfg.init == "identity":
        layers = [(torch.eye(dims[0]), torch.zeros(dims[0]))]
    if cfg.residual and layers:
        layers[-1] = tuple(torch.zeros_like(t) for t in layers[-1])
    return layers


@pytest.mark.parametrize("cfg", [HeadConfig(depth=1, in_dim=24, out_dim=24), HeadConfig(depth=2, hidden=40, in_dim=24),
                                 HeadConfig(depth=3, hidden=16, in_dim=24, out_dim=8, residual=False),
                                 HeadConfig(depth=1, in_dim=24, init="identity", residual=False),
                                 HeadConfig(depth=1, in_dim=24, init="identity"), HeadConfig(depth=0, in_dim=24)])
def test_stacked_init_equals_the_one_head_draws(cfg):
    seeds = [3, 0, 11, 3]
    model = StackedMLP(len(seeds), cfg, seeds=seeds)
    for h, seed in enumerate(seeds):
        for l, (w, b) in enumerate(_one_head(cfg, seed)):
            assert torch.equal(model.weights[l][h], w) and torch.equal(model.biases[l][h], b)
    assert len(model.weights) == cfg.depth
