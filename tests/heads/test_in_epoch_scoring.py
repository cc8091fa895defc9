"""Dev scored within long epochs (--eval-every, heads.training.cost) and early stopping counted in its scorings."""
import math

import pytest

from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.training.cost import LONG_EPOCH, MIN_INTERVAL, scoring_interval
from headstore.heads.training.tracker import dev_scores
from headstore.heads.training.train import train_one

from .synthetic import planted_sts_task


def reference_stop(history: list[dict], patience: int, warmup: int):
    """A plain loop over the scorings: (best step, the step the head stops at or None): the best so far resets
    the count; a scoring without an improvement after the warm-up adds one; `patience` of them stop it."""
    best, best_step, stale = -math.inf, 0, 0
    for h in history:
        if h["dev_spearman_manhattan"] > best:
            best, best_step, stale = h["dev_spearman_manhattan"], h["step"], 0
        elif h["step"] > warmup:
            stale += 1
            if stale == patience:
                return best_step, h["step"]
    return best_step, None


@pytest.mark.parametrize("lr", [1e-2, 3e-1])  # learns, then stalls / overshoots early
def test_scored_every_n_steps_and_stopped_where_a_loop_stops(lr):
    task, X = planted_sts_task(n_pairs=400)
    head_cfg = HeadConfig(depth=1, out_dim=8, in_dim=16, residual=False)
    cfg = TrainConfig(normalize="none", loss="l1-energy", graded="pearson", epochs=30, batch_size=16, lr=lr,
                      patience=3, eval_every=4, guard=False)
    model, norm, run = train_one(task, X, head_cfg, cfg, progress=False)
    steps_per_epoch = math.ceil(len(task.train) / 16)
    report = run.scoring
    assert report["every_steps"] == 4 and report["epoch_steps"] == steps_per_epoch
    expected_steps = [e * steps_per_epoch + k for e in range(30) for k in range(1, steps_per_epoch + 1)
                      if k % 4 == 0 or k == steps_per_epoch]
    steps = [h["step"] for h in run.history]
    assert steps == expected_steps[:len(steps)]  # every 4 steps of an epoch and at its end, in order
    best_step, stopped = reference_stop(run.history, cfg.patience, report["warmup_steps"])
    assert run.best_step == best_step and run.stopped_step == stopped
    assert stopped is not None and report["steps_run"] == stopped < report["planned_steps"]  # it stopped
    # the kept weights are the best scoring's: scored again, they give its dev figure
    again = dev_scores(task, "dev", model, norm(X), cfg.eval_energy, cfg.precision)[0]
    assert again == pytest.approx(run.best_dev, abs=1e-6)


def test_short_epochs_keep_one_scoring_each():
    """An epoch of at most LONG_EPOCH steps is scored once, at its end, under auto: the history has no steps."""
    task, X = planted_sts_task(n_pairs=400)
    cfg = TrainConfig(normalize="none", loss="l1-energy", epochs=3, batch_size=16, patience=3)
    _, _, run = train_one(task, X, HeadConfig(depth=1, out_dim=8, in_dim=16, residual=False), cfg, progress=False)
    assert [h["epoch"] for h in run.history] == [1, 2, 3] and all("step" not in h for h in run.history)
    assert run.scoring["every_steps"] == run.scoring["epoch_steps"]


def test_the_plan_scores_a_long_epoch_about_every_n_steps():
    assert scoring_interval(LONG_EPOCH, 10**6, 10**6) == LONG_EPOCH  # short: the epoch, whatever the cost
    n = scoring_interval(1728, 393_600, 4_000)  # one MiniLM head, 110 k pairs, 4 k dev rows
    assert MIN_INTERVAL <= n < 1728 and 1728 % n in (0, 1728 % n) and math.ceil(1728 / n) * n >= 1728
    assert scoring_interval(1728, 393_600, 400_000) > n  # dearer dev: scored less often
    assert scoring_interval(1728, 393_600, 4_000, every=100) == 100 and scoring_interval(50, 1, 1, every=100) == 50
