"""A stack's training settings are resolved once, at the door (heads.training.resolved): the derived values (the
ranking energy, the loss's constants, the Q schedule, the strength) come out as plain frozen values, a stack that
mixes shared settings or a solver its loss cannot take is refused there, and training on the resolved settings is
training on the TrainConfigs they came from."""
from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from headstore.heads.scoring.losses.settings import DEFAULT_Q
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.training.resolved import ResolvedTraining, as_plan, resolve_stack
from headstore.heads.training.train import train_one, train_stack

from .synthetic import planted_ir_task


def test_the_derived_settings_are_resolved_once():
    plan = resolve_stack([TrainConfig(), TrainConfig(seed=1, lr=1e-3, weight_decay=0.0)])
    assert (plan.lrs, plan.weight_decays, plan.seeds, plan.n_heads) == ((3e-3, 1e-3), (0.01, 0.0), (0, 1), 2)
    assert (plan.loss, plan.energy, plan.eval_energy, plan.q_schedule) == ("l1-energy", "l1", "l1", None)
    assert (plan.strength_setting, plan.strength, plan.adjusts_strength) == ("1", 1.0, False)
    mnr = resolve_stack([TrainConfig(loss="mnr", energy="l1")])
    assert mnr.eval_energy == "cosine"  # a loss that ignores the energy ranks with cosine (scoring_energy)
    auto = resolve_stack([TrainConfig(strength="auto")])
    assert (auto.strength, auto.adjusts_strength) == (None, True)
    assert resolve_stack([TrainConfig(strength="0.5")]).strength == 0.5
    scheduled = resolve_stack([TrainConfig(q_start=5.0)])
    assert scheduled.q_schedule == (5.0, DEFAULT_Q["l1"])  # toward the energy's default Q where --q is unset
    assert scheduled.q_at(0, 10) == 5.0 and scheduled.q_at(9, 10) == pytest.approx(DEFAULT_Q["l1"])
    assert plan.negatives == TrainConfig().negatives and plan.loss_config == TrainConfig().loss_config()


def test_the_resolved_settings_are_frozen_plain_values():
    plan = resolve_stack([TrainConfig(anchor_weight=2.0)])
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.anchor_weight = 0.0
    assert pickle.loads(pickle.dumps(plan)) == plan  # what a Ray worker could receive
    assert as_plan(plan) is plan and as_plan([TrainConfig(anchor_weight=2.0)]) == plan
    assert plan.settings == (TrainConfig(anchor_weight=2.0),)  # as given: the head's run record (config.json)


def test_a_stack_that_cannot_train_is_refused_at_the_door():
    with pytest.raises(ValueError, match="must be shared"):
        resolve_stack([TrainConfig(), TrainConfig(epochs=3)])
    with pytest.raises(ValueError, match="lbfgs"):
        resolve_stack([TrainConfig(solver="lbfgs", loss="l1-energy")])
    with pytest.raises(ValueError, match="at least one"):
        resolve_stack([])
    assert isinstance(resolve_stack([TrainConfig(seed=s) for s in range(3)]), ResolvedTraining)


def test_training_on_the_resolved_settings_is_training_on_the_configs():
    task, X = planted_ir_task(n_docs=120)
    head_cfg = HeadConfig(depth=1, out_dim=8, in_dim=16, residual=False)
    configs = [TrainConfig(normalize="none", mined_k=0, epochs=2, batch_size=16, q=8.0, seed=s) for s in (0, 1)]
    given, _, runs = train_stack(task, X.clone(), head_cfg, configs, progress=False)
    resolved, _, again = train_stack(task, X.clone(), head_cfg, resolve_stack(configs), progress=False)
    for a, b in zip(given.parameters(), resolved.parameters()):
        assert torch.equal(a, b)
    assert [r.history for r in runs] == [r.history for r in again] and again[1].config == configs[1]
    one, _, run = train_one(task, X.clone(), head_cfg, resolve_stack(configs[:1]), progress=False)
    assert torch.equal(next(one.parameters())[0], next(given.parameters())[0]) and run.config == configs[0]
