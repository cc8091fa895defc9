"""Progress for long work, suited to where it is read: tqdm bars on a terminal, a plain line every few seconds
in a log file or CI (no carriage returns: a main job's log is then tens of lines, not thousands of bar
frames).

`progress_bar(**tqdm_kwargs)` is the one way every command shows progress. The mode is chosen per call:
`HEADSTORE_PROGRESS=bars|lines|off` when set, else bars when standard error is a terminal, else lines.
Lines mode is tqdm with its output replaced (`LineProgress`): updates are throttled to one line per
`LINE_SECONDS`, plus the final one (every bar ends with a line of its real count, also one that is not left
on a terminal: a grid's stacks), each saying what, how far (in the bar's unit: tokens where texts vary),
the rate and the time left. Nothing is written before the first unit of work is done (no "0/450" line),
and the time left is taken from the rate after the first update (the first step of a stack carries one-off
work, a compile or a warm-up, that once made a 2-minute stack say "ETA 1:39:41").
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

from tqdm.auto import tqdm as terminal_tqdm
from tqdm.std import tqdm

LINE_SECONDS = 10.0  # a log line every 10 s: a 13-minute job writes ~80 lines per bar, not one per update
MODES = ("bars", "lines", "off")
ENV = "HEADSTORE_PROGRESS"


def progress_mode(stream=None) -> str:
    """bars, lines or off: HEADSTORE_PROGRESS when set, else bars on a terminal and lines elsewhere."""
    chosen = os.environ.get(ENV, "").strip().lower()
    if chosen:
        if chosen not in MODES:
            raise ValueError(f"{ENV}={chosen!r}; valid: {list(MODES)}")
        return chosen
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return "bars" if isatty is not None and isatty() else "lines"


class LineProgress(tqdm):
    """tqdm that writes whole lines (no '\\r', no cursor moves), at most one per `mininterval` seconds."""

    def __init__(self, *args, mininterval: float = LINE_SECONDS, **kwargs):
        kwargs.pop("dynamic_ncols", None)
        kwargs.pop("ncols", None)
        self._last_line, self._last_write_t = None, None
        self._first = None  # (n, elapsed) at the first update: the ETA's rate is the one after it
        super().__init__(*args, mininterval=mininterval, miniters=0, **kwargs)

    def update(self, n=1):
        if self._first is None and n and not self.disable and hasattr(self, "start_t"):
            self._first = (self.n + n, self._time() - self.start_t)
        return super().update(n)

    def display(self, msg=None, pos=None):
        if not self.disable and self.n:  # nothing done yet: nothing to say
            self._write(force=False)
        return True

    def close(self):
        """The final line (its real count; in a log nothing is erased, so whether or not the bar is left), then
        tqdm's bookkeeping without its '\r' or '\n'."""
        if getattr(self, "disable", True):
            return
        self._write(force=True)
        self.disable = True
        self._decr_instances(self)

    def _write(self, force: bool) -> None:
        """One line, unless one was written less than `mininterval` ago (set_postfix and tqdm.write refresh
        on every call) or it would repeat the last."""
        now = self._time()
        last = getattr(self, "start_t", now) if self._last_write_t is None else self._last_write_t  # the first
        # line after an interval too (start_t is missing when tqdm's __init__ failed: the bar is then closed)
        if not force and now - last < self.mininterval:
            return
        line = self.line()
        if line != self._last_line:
            self.fp.write(line + "\n")
            self.fp.flush()
            self._last_line, self._last_write_t = line, now

    def clear(self, nolock=False):  # nothing to erase: lines stay
        return None

    def moveto(self, n):  # no cursor movement between nested bars
        return None

    def line(self) -> str:
        """`desc: n/total unit (pct%), rate, elapsed, ETA, postfix` in plain text."""
        d = self.format_dict
        unit, scale = d.get("unit") or "it", d.get("unit_scale")
        size = tqdm.format_sizeof if scale else (lambda x: f"{x:,.0f}" if x >= 10 or x == int(x) else f"{x:.2f}")
        total = d.get("total")
        done = f"{size(d['n'])}/{size(total)} {unit} ({100 * d['n'] / total:.0f}%)" if total else f"{size(d['n'])} {unit}"
        elapsed = d.get("elapsed") or 0.0
        rate = d["n"] / elapsed if elapsed > 0 else None
        parts = [done, f"{size(rate)} {unit}/s" if rate else None, f"elapsed {tqdm.format_interval(elapsed)}"]
        if total and d["n"] < total and self._first and d["n"] > self._first[0] and elapsed > self._first[1]:
            since_first = (d["n"] - self._first[0]) / (elapsed - self._first[1])
            parts.append(f"ETA {tqdm.format_interval((total - d['n']) / since_first)}")
        postfix = d.get("postfix")
        if postfix:
            parts.append(str(postfix).lstrip(", "))
        prefix = d.get("prefix") or "progress"
        return f"{prefix}: " + ", ".join(p for p in parts if p)


def progress_bar(*args, disable: bool = False, **kwargs):
    """A tqdm-like progress bar for this process's standard error (see the module doc for the mode)."""
    mode = progress_mode(kwargs.get("file"))
    if mode == "off":
        return tqdm(*args, disable=True, **kwargs)
    if mode == "lines":
        return LineProgress(*args, disable=disable, **kwargs)
    return terminal_tqdm(*args, disable=disable, **kwargs)


def progress_write(message: str) -> None:
    """A message line on standard error that does not break a bar being drawn (tqdm.write)."""
    tqdm.write(message, file=sys.stderr)


@contextlib.contextmanager
def quiet_library_bars() -> Iterator[None]:
    """Outside bars mode, the progress bars libraries draw themselves (transformers' "Loading weights",
    datasets' "Saving the dataset") turned off for the block, then turned back on if they were on: in a log
    they are carriage-return frames, and a notebook that embeds headstore keeps its own setting."""
    restore = [] if progress_mode() == "bars" else [lib for lib in map(_bars_of, LIBRARY_LOGGING) if lib]
    for lib in restore:
        lib.disable_progress_bar()
    try:
        yield
    finally:
        for lib in restore:
            lib.enable_progress_bar()


LIBRARY_LOGGING = ("transformers.utils.logging", "datasets.utils.logging")  # modules with *_progress_bar()


def _bars_of(module: str):
    """The logging module of a library already imported whose progress bars are on (None: else)."""
    if module.split(".")[0] not in sys.modules:
        return None  # not imported: nothing of it will draw here
    try:
        lib = __import__(module, fromlist=["is_progress_bar_enabled"])
        return lib if lib.is_progress_bar_enabled() else None
    except (ImportError, AttributeError):
        return None
