"""A grid's plan: losses that reduce to the same objective on a data form (heads.scoring.losses.objective, the
registry's `reduces_to`) are trained once and said so; the plan's time estimate and its update after the first
stack (heads.experiments.grid.estimate)."""
import itertools
import json

import numpy as np
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
    from headstore.heads.experiments.grid.estimate import head_params, pace_line

    assert head_params(HeadConfig(depth=1, out_dim=4), 3) == 3 * 4 + 4
    assert head_params(HeadConfig(depth=2, hidden=5, out_dim=4), 3) == (3 * 5 + 5) + (5 * 4 + 4)
    line = pace_line(30.0, [10.0, 20.0, 40.0])
    assert "took 30 s (3.0x the plan's model)" in line
    assert "the other 2 stack(s) about 3.0 min" in line  # 3 x (20 + 40) s


def test_an_ir_task_above_exact_max_is_costed_on_its_candidates_not_the_corpus():
    """Dev of 5 queries (1 judged document each) over 400 documents: above exact_max the plan counts the
    queries and at most 5 x pool_k candidates + 5 judged (5 + 55 rows), at or below it the corpus (5 + 400),
    and never fewer rows than the candidates selection_set makes; with re-mining off, the two plans differ by
    exactly epochs x EVAL_SECONDS x params x the 345 rows."""
    from headstore.heads.experiments.grid import estimate as ge
    from headstore.heads.kinds import kind_of
    from headstore.heads.kinds.ranking import IRSplit
    from headstore.heads.training.cost import EVAL_SECONDS
    from headstore.heads.settings.config import HeadConfig, TrainConfig

    from .synthetic import planted_ir_task

    task, X = planted_ir_task(n_docs=400, dim=8)
    dev = task.eval_sets["dev"]
    ids = dev.query_ids[:5]
    task.eval_sets["dev"] = IRSplit(ids, dev.query_rows[:5], dev.doc_ids, dev.doc_rows, {q: dev.qrels[q] for q in ids})
    kind = kind_of(task)
    small = TrainConfig(exact_max=100, pool_k=10, remine=False, epochs=3)
    large = TrainConfig(exact_max=400, pool_k=10, remine=False, epochs=3)
    assert kind.selection_rows(task, "dev", small.negatives) == 5 + 5 * 10 + 5
    assert kind.selection_rows(task, "dev", large.negatives) == 5 + 400
    chosen, report = kind.selection_set(task, "dev", X, small.negatives)
    assert report["method"] == "candidates" and len(kind.rows(chosen)) <= 5 + 55
    head = HeadConfig(depth=1, out_dim=8)
    params = 2 * ge.head_params(head, 8)
    seconds = {cfg.exact_max: ge.stack_seconds([(i, head, cfg, "features") for i in range(2)], task, 8)
               for cfg in (small, large)}
    assert seconds[400] - seconds[100] == pytest.approx(3 * EVAL_SECONDS * params * (400 - 55))


def test_re_mining_is_costed_on_the_pooled_documents_above_exact_max():
    """240 training queries re-mined at epochs 1 and 2 of 3: each re-mine embeds the 240 anchors and
    min(400, 240 x pool_k) pooled documents above exact_max, the 400 documents at or below it; off: nothing."""
    from headstore.heads.experiments.grid.estimate import remine_rows
    from headstore.heads.settings.config import TrainConfig

    from .synthetic import planted_ir_task

    task, _ = planted_ir_task(n_docs=400, dim=8)
    anchors = task.train.anchor
    assert len(np.unique(anchors)) == 240
    cfg = dict(epochs=3, mined_k=4, loss="l1-energy")
    assert remine_rows(task, TrainConfig(exact_max=100, pool_k=10, **cfg), anchors) == 2 * (240 + 400)
    assert remine_rows(task, TrainConfig(exact_max=1000, pool_k=10, **cfg), anchors) == 2 * (240 + 400)
    task2 = type(task)(task.name, task.kind, task.train, task.eval_sets, task.dev_note, np.arange(4000),
                       task.relevant)
    assert remine_rows(task2, TrainConfig(exact_max=100, pool_k=10, **cfg), anchors) == 2 * (240 + 2400)
    assert remine_rows(task2, TrainConfig(exact_max=5000, pool_k=10, **cfg), anchors) == 2 * (240 + 4000)
    assert remine_rows(task2, TrainConfig(exact_max=100, pool_k=10, remine_every=2, **cfg), anchors) == 240 + 2400
    assert remine_rows(task2, TrainConfig(exact_max=100, pool_k=10, remine=False, **cfg), anchors) == 0
