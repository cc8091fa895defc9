"""The start's dev score of a stack of residual heads (f(x) = x + 0 at the start) is the features' score, computed
once for the stack: bit for bit what each head's own forward pass scores, without the pass."""
import dataclasses

import pytest
import torch

from headstore.heads.network.model import StackedMLP, outputs_inputs, start_of
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.training.tracker import dev_scores
from headstore.heads.training.train import train_stack

from .synthetic import planted_ir_task, planted_sts_task


def _configs(loss, precision, **kw):
    base = TrainConfig(normalize="l2", loss=loss, epochs=1, batch_size=32, precision=precision, **kw)
    return [dataclasses.replace(base, lr=lr, seed=s) for lr, s in ((1e-3, 0), (1e-2, 1), (3e-3, 2))]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("kind", ["sts", "ir"])
def test_the_start_scores_are_each_heads_own(kind, depth, precision, monkeypatch):
    task, X = planted_sts_task(n_pairs=300) if kind == "sts" else planted_ir_task(n_docs=200)
    head = HeadConfig(depth=depth, hidden=8, in_dim=16, out_dim=16)  # residual: the default
    eval_passes = []
    forward = StackedMLP.forward
    monkeypatch.setattr(StackedMLP, "forward", lambda self, x: (eval_passes.append(self.training), forward(self, x))[1])
    model, norm, runs = train_stack(task, X, head, _configs("l1-energy", precision), progress=False)
    # one epoch: its dev scoring embeds dev's two sides, the start none
    assert eval_passes.count(False) == 2, eval_passes.count(False)
    monkeypatch.setattr(StackedMLP, "forward", forward)
    start = start_of(model)
    assert outputs_inputs(start) and not outputs_inputs(model)
    own = dev_scores(task, "dev", start, norm(X), "l1", precision)  # each head's forward pass, as before
    assert [r.start_dev for r in runs] == own and len(set(own)) == 1


def test_heads_that_do_not_give_back_their_input_are_scored_through_their_pass():
    task, X = planted_sts_task(n_pairs=300)
    head = HeadConfig(depth=1, in_dim=16, out_dim=8, residual=False)
    _, _, runs = train_stack(task, X, head, _configs("l1-energy", "fp32"), progress=False)
    assert len({r.start_dev for r in runs}) == 3  # three seeds' random starts
    assert not outputs_inputs(StackedMLP(2, head))
    mixed = HeadConfig(depth=1, in_dim=16, out_dim=16, mix=2)  # a scalar mix normalises: not the input itself
    assert not outputs_inputs(StackedMLP(2, mixed))
    residual = StackedMLP(2, HeadConfig(depth=1, in_dim=16, out_dim=16))
    with torch.no_grad():
        residual.biases[-1][1, 3] = 1e-30  # one number off zero in one head
    assert not outputs_inputs(residual)
