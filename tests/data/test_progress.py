"""Progress: bars on a terminal, one plain line per interval in a log (no carriage returns)."""
from __future__ import annotations

import io

import pytest

from headstore.data.progress import ENV, LineProgress, progress_bar, progress_mode


class Clock:
    """A fake time.time for tqdm: the test moves it."""

    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_one_line_per_interval_and_no_carriage_returns(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    clock = Clock()
    monkeypatch.setattr("tqdm.std.time", clock)
    log = io.StringIO()  # not a terminal
    bar = progress_bar(total=3500, unit="tok", desc="featurize", file=log, mininterval=10)
    assert isinstance(bar, LineProgress)
    for _ in range(35):  # 35 s of work, 100 tokens a second, a postfix each time (refreshes on every call)
        clock.now += 1.0
        bar.update(100)
        bar.set_postfix(texts=bar.n // 10)
    bar.close()
    text = log.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert len(lines) == 4  # one per 10 s (at 10, 20, 30 s), the end; none before any work is done
    assert lines[0].startswith("featurize: 1,000/3,500 tok (29%)")
    assert lines[-1].startswith("featurize: 3,500/3,500 tok (100%), 100 tok/s, elapsed 00:35")
    assert "ETA 00:15" in lines[1]  # 2,000 of 3,500 at 100/s after 20 s


def test_a_terminal_gets_tqdm_bars_and_the_mode_can_be_forced(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    term = Terminal()
    bar = progress_bar(total=10, desc="x", file=term)
    assert not isinstance(bar, LineProgress)
    bar.update(10)
    bar.close()
    assert "\r" in term.getvalue()  # tqdm redraws in place
    assert progress_mode(Terminal()) == "bars" and progress_mode(io.StringIO()) == "lines"
    monkeypatch.setenv(ENV, "lines")
    assert isinstance(progress_bar(total=1, file=Terminal()), LineProgress)
    monkeypatch.setenv(ENV, "off")
    quiet = io.StringIO()
    bar = progress_bar(total=5, file=quiet)
    bar.update(5)
    bar.close()
    assert quiet.getvalue() == ""
    monkeypatch.setenv(ENV, "loud")
    with pytest.raises(ValueError, match="HEADSTORE_PROGRESS='loud'; valid: \\['bars', 'lines', 'off'\\]"):
        progress_bar(total=1)


def test_a_bar_not_left_still_ends_with_its_real_count_and_unknown_totals_read_plainly(monkeypatch):
    """A grid's stack bar (leave=False) that finishes within one interval writes one line, its final count,
    not a "0/450" line and then nothing."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr("tqdm.std.time", Clock())  # no time passes
    log = io.StringIO()
    bar = progress_bar(desc="train", unit="step", file=log, leave=False)
    bar.update(3)
    bar.close()
    assert log.getvalue().splitlines() == ["train: 3 step, elapsed 00:00"]
    log = io.StringIO()
    bar = progress_bar(total=450, desc="12 head(s) l1-energy", file=log, leave=False)
    bar.update(450)
    bar.close()
    assert log.getvalue().splitlines() == ["12 head(s) l1-energy: 450/450 it (100%), elapsed 00:00"]


def test_the_time_left_leaves_out_a_slow_first_step(monkeypatch):
    """A first step that carries a compile (100 s) then 1 s a step: the time left is the steps left at 1 s,
    not at the average rate with the compile in it (once "ETA 1:39:41" for a 2-minute stack)."""
    monkeypatch.delenv(ENV, raising=False)
    clock = Clock()
    monkeypatch.setattr("tqdm.std.time", clock)
    log = io.StringIO()
    bar = progress_bar(total=450, desc="stack", file=log, mininterval=10)
    clock.now += 100.0
    bar.update(1)
    for _ in range(20):
        clock.now += 1.0
        bar.update(1)
    bar.close()
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("stack: 1/450 it (0%)") and "ETA" not in lines[0]  # one step: no rate yet
    assert "ETA 07:19" in lines[1], lines  # at 110 s: 11 done, 439 left at 1 step/s


def test_a_bar_resumed_part_way_draws_without_error(monkeypatch):
    """A bar starting at initial > 0 (a resumed `adapt`) is drawn by tqdm before its clock is set: no error,
    and its final line counts from where it resumed."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr("tqdm.std.time", Clock())
    log = io.StringIO()
    bar = progress_bar(total=10, initial=3, desc="adapt", unit="step", file=log)
    bar.update(2)
    bar.close()
    assert log.getvalue().splitlines() == ["adapt: 5/10 step (50%), elapsed 00:00"]
