"""A grid's plan: losses that reduce to the same objective on a data form (heads.scoring.losses.objective, the
registry's `reduces_to`) are trained once and said so; the plan's time estimate and its update after the first
stack (heads.experiments.grid_estimate)."""
import itertools
import json

import polars as pl
import pytest
import torch

from headstore.heads.scoring.losses import FORMS, LOSSES, LossConfig, objective
from headstore.heads.scoring.losses.settings import GRADED_MODES

from .conftest import cli


def _batch(form: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    za, zp = torch.randn(3, 16, 8, generator=g), torch.randn(3, 16, 8, generator=g)
    labels = torch.rand(16, generator=g) if form == "graded" else (torch.rand(16, generator=g) > 0.5).float()
    return za, zp, labels


@pytest.mark.parametrize("form", ["graded", "binary"])
def test_losses_with_one_objective_compute_the_same_loss_and_the_others_do_not(form):
    """The registry's claim checked against the loss functions themselves: on labelled pairs without negatives,
    two losses `objective` names alike give the same value on random batches; two it names apart differ."""
    for graded in GRADED_MODES:
        cfg = LossConfig(graded=graded)
        takes = [n for n, s in LOSSES.items() if form in s.accepts]  # labels enter these losses
        for a, b in itertools.combinations(takes, 2):
            same = objective(a, form, graded, negatives=False) == objective(b, form, graded, negatives=False)
            for seed in range(3):
                za, zp, labels = _batch(form, seed)
                la = LOSSES[a].function(form)(za, zp, labels=labels, cfg=cfg)
                lb = LOSSES[b].function(form)(za, zp, labels=labels, cfg=cfg)
                assert torch.equal(la, lb) == same, (a, b, form, graded, seed)
    assert objective("l1-energy", form, "pearson", negatives=False) == objective("contrastive", form, "pearson",
                                                                                 negatives=False)


def test_negatives_or_another_form_keep_each_loss_its_own():
    """Given or mined negatives add each loss's own impostor term: the losses differ, so does the objective."""
    za, zp, labels = _batch("graded", 0)
    zn = torch.randn(3, 16, 2, 8, generator=torch.Generator().manual_seed(1))
    cfg = LossConfig(graded="pearson")
    assert not torch.equal(LOSSES["l1-energy"].function("graded")(za, zp, zn, labels=labels, cfg=cfg),
                           LOSSES["contrastive"].function("graded")(za, zp, zn, labels=labels, cfg=cfg))
    assert objective("l1-energy", "graded", "pearson", negatives=True) == "l1-energy"
    for form in set(FORMS) - {"graded", "binary"}:
        assert objective("contrastive", form, "pearson", negatives=False) == "contrastive"


def test_a_grid_trains_one_objective_once_and_says_so(data_world, tmp_path):
    """On graded STS pairs under --graded pearson, contrastive trains what l1-energy trains: the plan says so,
    the contrastive configurations are recorded as same-objective with the id of their trained twin, the
    leaderboard ranks the objective once, and the plan's time is updated after the first stack."""
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nloss = ["l1-energy", "contrastive", "cosent"]\nseed = [0, 1]\n'
                    '[fixed]\nepochs = 2\nhidden = 16\nbatch_size = 8\ngraded = "pearson"\n')
    out = tmp_path / "g"
    r = cli("grid", "--store", data_world["store"], "--data", data_world["sts05"], "--grid", grid, "--out", out)
    assert r.exit_code == 0, r.output
    assert "grid plan: 4 head(s) to train in 2 stack(s)" in r.output
    assert "trained once: 2 configuration(s)" in r.output and "contrastive trains what l1-energy trains" in r.output
    assert "rough time on a 2-core CPU:" in r.output
    assert "grid: the first stack took" in r.output and "the other 1 stack(s) about" in r.output
    rows = pl.read_parquet(out / "results.parquet")
    twins = rows.filter(pl.col("loss") == "contrastive")
    assert twins["status"].to_list() == ["same-objective"] * 2
    energy = {r["seed"]: r["head_id"] for r in rows.filter(pl.col("loss") == "l1-energy").iter_rows(named=True)}
    assert {r["seed"]: r["same_as"] for r in twins.iter_rows(named=True)} == energy
    leaderboard = (out / "leaderboard.md").read_text()
    assert "| contrastive" not in leaderboard and "same-objective ×2: contrastive trains what l1-energy" in leaderboard
    assert json.loads(rows.filter(pl.col("loss") == "l1-energy")["history"][0])  # trained


def test_the_estimate_follows_the_stacks_work():
    """The modelled seconds grow with the heads' size and the steps, and the update scales the rest by the
    first stack's measured pace (its seconds over its modelled seconds)."""
    from headstore.heads.settings.config import HeadConfig
    from headstore.heads.experiments.grid_estimate import head_params, pace_line

    assert head_params(HeadConfig(depth=1, out_dim=4), 3) == 3 * 4 + 4
    assert head_params(HeadConfig(depth=2, hidden=5, out_dim=4), 3) == (3 * 5 + 5) + (5 * 4 + 4)
    line = pace_line(30.0, [10.0, 20.0, 40.0], compiled=12.0)
    assert "took 30 s + 12 s compiling, once (3.0x the plan's model)" in line
    assert "the other 2 stack(s) about 3.0 min" in line  # 3 x (20 + 40) s
