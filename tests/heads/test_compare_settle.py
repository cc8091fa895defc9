"""Issue 37: when an MLM run's loss has settled (featurize.tuning.settle, the rule `cli compare` prints and
`adapt --until-settled` stops on), on constructed curves of ten-step means."""
import math
import random

import pytest

from headstore.featurize.tuning.settle import SETTLE_CHANGE, settled


def curve(losses):
    return [{"step": 10 * (i + 1), "loss": float(v)} for i, v in enumerate(losses)]


def ten_step_means(loss_at, steps: int):
    return [sum(loss_at(t) for t in range(i, i + 10)) / 10 for i in range(0, steps, 10)]


def plateau(n_fall: int, n_flat: int, level: float, noise: float, seed: int = 0):
    """A loss that falls from 2 x level to level over n_fall windows, then stays there with noise."""
    rng = random.Random(seed)
    fall = [level * (2 - i / n_fall) for i in range(n_fall)]
    return fall + [level * (1 + rng.uniform(-noise, noise)) for _ in range(n_flat)]


def test_a_diverging_run_has_not_settled():
    # it fell, then rose by far more than 2%: the old rule (drop < 2%, a rise being a negative drop) said settled
    ok, drop = settled(curve([5.0, 4.0, 3.5, 3.4, 3.6, 3.9, 4.3, 4.8]))
    assert not ok and drop < -SETTLE_CHANGE
    assert not settled(curve([3.0, 3.1, 3.3, 3.6, 4.0, 4.5, 5.1, 5.8]))[0]  # rose from the start


def test_a_run_whose_loss_never_fell_has_not_settled():
    # flat within 1% in its second half, but it ended above where it started: it learned nothing
    ok, drop = settled(curve([3.0, 3.05, 3.06, 3.05, 3.07, 3.06, 3.07, 3.06]))
    assert not ok and abs(drop) < SETTLE_CHANGE


def test_a_flat_curve_after_a_fall_has_settled_whatever_its_noise():
    for seed in range(20):
        assert settled(curve(plateau(8, 32, 4.0, 0.03, seed)))[0], seed


def test_one_lucky_window_at_the_end_does_not_decide():
    # a plateau whose last ten-step mean dips by 3% (one easy batch): the quarters' means barely move; the old
    # rule compared two single ten-step means and said NOT settled
    losses = plateau(8, 32, 4.0, 0.0)
    losses[-1] *= 0.97
    ok, drop = settled(curve(losses))
    assert ok and 0 < drop < 0.01


def test_a_still_falling_curve_has_not_settled():
    ok, drop = settled(curve(ten_step_means(lambda t: 2 + 8 / (1 + t / 30), 400)))
    assert not ok and drop > SETTLE_CHANGE


def test_a_curve_flattened_by_a_decaying_lr_has_not_settled():
    """Progress proportional to a linearly decaying lr: the last two ten-step means differ by 0.02%, yet the
    second half still lowered the loss by 5%. The same run at a constant lr has settled by its end."""
    steps = 400
    decaying = ten_step_means(lambda t: 3 + 2 * math.exp(-(t - t * t / (2 * steps)) / 120), steps)
    assert abs(decaying[-2] - decaying[-1]) / decaying[-2] < 0.001
    ok, drop = settled(curve(decaying))
    assert not ok and drop == pytest.approx(0.0536, abs=1e-3)
    assert settled(curve(ten_step_means(lambda t: 3 + 2 * math.exp(-t / 40), steps)))[0]


def test_quarters_against_a_plain_loop():
    """The verdict from the first, middle and last quarter means, computed here by a plain loop."""
    rng = random.Random(1)
    for _ in range(200):
        n = rng.randint(4, 60)
        losses = [rng.uniform(1.0, 5.0) for _ in range(n)]
        q = n // 4
        first = sum(losses[:q]) / q
        middle = sum(losses[(n - q) // 2:(n - q) // 2 + q]) / q
        last = sum(losses[n - q:]) / q
        ok, drop = settled(curve(losses))
        assert drop == pytest.approx((middle - last) / middle)
        assert ok == (last < first and abs(middle - last) < SETTLE_CHANGE * middle)
    assert settled(curve([9.0, 5.0, 4.0])) == (False, None)  # too short to say
