"""The distillation study's share of the teacher's gain (bench/studies/distill_study.share_ci, also used by
distill_runs_ci.py and compare_controls.py): the resamples where the teacher gains nothing are dropped and counted,
and where more than 5% are dropped no interval is given (issue 54, item 4: 11% of 1,000 were dropped silently)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies"))
distill_study = pytest.importorskip("distill_study")


def _items(teacher_gain: float, seed: int = 0, S: int = 3, n: int = 300) -> dict:
    """Per-item values (S seeds x n items) of the single head, a teacher `teacher_gain` above it, a student half-way."""
    rng = np.random.default_rng(seed)
    single = rng.normal(0.5, 0.3, size=(S, n))
    teacher = single + teacher_gain + rng.normal(0, 0.3, size=(S, n))
    student = single + teacher_gain / 2 + rng.normal(0, 0.3, size=(S, n))
    return {"single": single, "teacher": teacher, "distilled": student, "gold": None}


def test_a_clear_gain_has_a_share_ci_around_the_share_and_says_nothing_was_dropped():
    items = _items(0.2)
    got = distill_study.share_ci(items, "mean")
    share = np.mean(items["distilled"] - items["single"]) / np.mean(items["teacher"] - items["single"])
    assert got["dropped"] == 0.0 and got["ci"][0] < share < got["ci"][1]
    assert "0.0% of resamples dropped" in distill_study.share_words(share, got)


def test_an_unresolved_gain_gets_no_share_ci_and_says_how_many_resamples_were_dropped():
    items = _items(0.0, seed=1)  # no gain: about half the resamples have the teacher at or below the single head
    got = distill_study.share_ci(items, "mean")
    teacher_gains = np.mean(items["teacher"] - items["single"])
    assert 0.2 < got["dropped"] < 0.8, got  # near half (a loop over resamples would say the same)
    assert got["ci"] is None and got["note"].startswith("gain not resolved")
    words = distill_study.share_words(0.5 if teacher_gains else None, got)
    assert "gain not resolved" in words and "[" not in words
