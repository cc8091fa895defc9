"""When has an MLM run's training loss settled: one rule for `cli adapt --until-settled` (featurize.tuning.adapt)
and the line `cli compare` prints under its table (heads.experiments.compare.table).

The rule reads the run's curve of ten-step mean losses in quarters: the first quarter's mean (where the run
started), the mean of the quarter in the middle of the run and the last quarter's mean. Averaging a quarter of
the curve, not one ten-step mean, keeps the noise of single batches out of the verdict. A run has settled when

- the loss fell: the last quarter's mean is below the first quarter's (a run that rose, diverging, or never
  learned has not settled, however flat its end), and
- its second half moved it by little: the middle quarter's and the last quarter's means differ by less than
  SETTLE_CHANGE of the middle one, either way (a loss still falling by more is still learning; one rising by
  more is starting to diverge; a smaller rise at a plateau is the noise of the windows).

Comparing the middle of the run with its end, not the last two windows, matters under a decaying learning
rate: the last windows of such a run are flat because the rate reached ~0, not because the loss settled.
"""
from __future__ import annotations

SETTLE_CHANGE = 0.02  # 2% of the loss between the middle and the last quarter: below the gains that matter
MIN_WINDOWS = 4  # ten-step means the rule needs: one per quarter


def _mean(curve: list[dict]) -> float:
    return sum(point["loss"] for point in curve) / len(curve)


def quarter_means(curve: list[dict]) -> tuple[float, float, float] | None:
    """(first, middle, last) quarter means of a curve of ten-step means ([{"step", "loss"}]); None when the
    curve has fewer than MIN_WINDOWS points."""
    n = len(curve)
    if n < MIN_WINDOWS:
        return None
    q = n // 4
    start = (n - q) // 2  # the quarter centred on the run's middle
    return _mean(curve[:q]), _mean(curve[start:start + q]), _mean(curve[-q:])


def settled(curve: list[dict]) -> tuple[bool, float | None]:
    """(has the loss settled, how much the second half lowered it: (middle - last) / middle, negative when
    it rose); (False, None) for a curve too short to judge."""
    means = quarter_means(curve)
    if means is None:
        return False, None
    first, middle, last = means
    drop = (middle - last) / middle
    return last < first and abs(drop) < SETTLE_CHANGE, drop
