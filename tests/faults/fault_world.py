"""The fault suite's tiny world and its checks: a random BERT, a pairs table, its store, a head, a grid.

Every command is run with a bound (a hang fails the test instead of stopping the suite); after a fault the
checks are the issue's: exit within the bound, one `Error: ...` line naming the file and the OS error, no
traceback, the store verifies, and the same command run again gives what an uninterrupted run gives."""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
from pathlib import Path

import numpy as np
import polars as pl
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "featurize"))
from featurize_helpers import build_tiny_bert, random_texts  # noqa: E402

from headstore.cli import main  # noqa: E402
from headstore.featurize.store.reader import FeatureStore  # noqa: E402
from headstore.featurize.store.verify import verify_store  # noqa: E402
from fault_child import Child  # noqa: E402
from fault_inject import Fault, injected  # noqa: E402

BOUND_S = 300  # a command that has not ended by then hangs (they take seconds; the bound allows a loaded machine)
TRAIN = ("--epochs", "2", "--hidden", "16", "--batch-size", "8", "--mined-k", "2")
GRID = '[grid]\nlr = [1e-3, 3e-3]\nseed = [0, 1]\n[fixed]\nepochs = 2\nhidden = 16\nbatch_size = 8\nmined_k = 2\n'
STORE_OPTS = ("--dtype", "float32", "--batch-tokens", "128")


def make_world(root: Path) -> dict:
    """The model, a pairs table (train/dev/test) and its grid file; stores and heads are made by tests."""
    w = {"root": root, "model": build_tiny_bert(root / "model")}
    texts = random_texts(120, seed=5, max_words=12)
    rng = random.Random(5)
    anchors, positives = texts[:60], texts[60:]
    rng.shuffle(positives)
    w["pairs"] = root / "pairs.parquet"
    pl.DataFrame({"anchor": anchors, "positive": positives,
                  "split": ["train"] * 36 + ["dev"] * 12 + ["test"] * 12}).write_parquet(w["pairs"])
    w["more"] = root / "more.txt"  # texts a second featurize appends
    w["more"].write_text("\n".join(random_texts(40, seed=9, max_words=12)) + "\n")
    w["grid"] = root / "grid.toml"
    w["grid"].write_text(GRID)
    return w


def featurize_args(w: dict, store: Path, data: Path | None = None) -> list:
    return ["featurize", "--model", w["model"], "--data", data or w["pairs"], "--store", store, *STORE_OPTS]


def bounded(fn, seconds: float = BOUND_S):
    """fn() in a thread; AssertionError when it has not returned within `seconds` (a hang)."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 -- handed to the test
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"no answer within {seconds} s: a hang"
    if "error" in box:
        raise box["error"]
    return box["value"]


def cli(*args, fault: Fault | None = None):
    """`cli ARGS` in this process (a fault injected for the run), within the bound; click's Result."""
    def run():
        if fault is None:
            return CliRunner().invoke(main, [str(a) for a in args])
        with injected(fault):
            return CliRunner().invoke(main, [str(a) for a in args])
    return bounded(run)


def cli_child(*args, fault: str | None = None, wait: bool = True) -> Child:
    """`cli ARGS` in a child process with `fault` (SITE:WHAT:NTH) injected (tests/faults/fault_child.py);
    with wait, ended (within the bound) with its returncode, stdout and stderr."""
    child = Child(args, fault or "atomic:count:1")
    if wait:
        child.communicate(timeout=BOUND_S)
    return child


def assert_ok(result) -> None:
    code = getattr(result, "exit_code", getattr(result, "returncode", None))
    text = getattr(result, "output", None) or (result.stdout + result.stderr)
    assert code == 0, (text[-3000:], getattr(result, "exception", None))


def assert_one_error_line(text: str, *needles: str) -> str:
    """One `Error: ...` line (the last), naming each needle; no traceback."""
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, text[-3000:]
    for needle in needles:
        assert needle.lower() in errors[0].lower(), (needle, errors[0])
    return errors[0]


def assert_write_error(result, fault: Fault) -> str:
    """A write error: exit 1 (2 for a vanished folder: a FileNotFoundError), one line naming a file and the
    OS error."""
    code = getattr(result, "exit_code", getattr(result, "returncode", None))
    text = getattr(result, "output", None) or (result.stdout + result.stderr)
    assert code == (2 if fault.what == "ENOENT" else 1), (code, text[-3000:])
    import errno
    line = assert_one_error_line(text, os.strerror(getattr(errno, fault.what)))
    assert "/" in line, line  # a path
    return line


def store_snapshot(path: Path) -> dict:
    """text id -> {array: its features' bytes}; every text once."""
    store = FeatureStore.open(path)
    ids = store.texts["text_id"].to_list()
    assert len(ids) == len(set(ids)), "a text committed twice"
    feats = {name: store.features(name) for name in store.arrays}
    return {t: {n: feats[n][i].tobytes() for n in feats} for i, t in enumerate(ids)}


def assert_store_equal(path: Path, reference: dict) -> None:
    assert verify_store(path) == []
    assert store_snapshot(path) == reference  # the same texts, bit for bit


def metrics_of(out: Path) -> dict:
    m = json.loads((out / "metrics.json").read_text())
    return {split: m[split] for split in ("dev", "test") if split in m}


def assert_close(a, b, tol: float = 1e-6, where: str = "") -> None:
    """Equal structures, numbers within tol."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_close(a[k], b[k], tol, f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, tol, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert (a is None and b is None) or abs(a - b) <= tol or (np.isnan(a) and np.isnan(b)), (where, a, b)
    else:
        assert a == b, (where, a, b)


def grid_rows(out: Path) -> dict:
    """head_id -> its figures (every head once)."""
    frame = pl.read_parquet(out / "results.parquet")
    ids = frame["head_id"].to_list()
    assert len(ids) == len(set(ids)), "a head recorded twice"
    cols = [c for c in frame.columns if c.endswith("_primary") or c == "status"]
    return {r["head_id"]: {c: r[c] for c in cols} for r in frame.to_dicts()}


def seeded_nth(seed: int, calls: int) -> int:
    """The call (1-based) a seed picks among `calls`."""
    return random.Random(seed).randint(1, max(1, calls))


def sigint_or_kill_ok(proc, what: str) -> None:
    """The child ended as the signal says: SIGKILL killed it; SIGINT: exit 130, no traceback, one line."""
    if what == "SIGKILL":
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
        return
    assert proc.returncode == 130, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert sum(line.startswith("interrupted") for line in proc.stderr.splitlines()) == 1, proc.stderr[-1000:]


def assert_whole_commits(store: Path) -> None:
    """Right after a kill: `cli store verify` finds nothing but an interrupted commit's leftovers (which the
    next writer removes); the committed rows read back."""
    if not (store / "manifest.json").is_file():
        return
    problems = verify_store(store)
    assert all("uncommitted" in p for p in problems), problems
    FeatureStore.open(store).features()


_counts: dict = {}  # command -> (calls per site of an uninterrupted run, its reference result), once a session


def counted(name: str, run) -> tuple[dict, object]:
    """Calls per site of an uninterrupted `run(fault)` and what it returned (the reference)."""
    if name not in _counts:
        fault = Fault("atomic")
        reference = run(fault)
        _counts[name] = (dict(fault.calls), reference)
    return _counts[name]


def pick(calls: dict, site: str, what: str, seed: int) -> Fault:
    """The fault `what` at the call of `site` the seed picks among an uninterrupted run's."""
    assert calls.get(site), f"no {site} write in an uninterrupted run: {calls}"
    return Fault(site, what, seeded_nth(seed, calls[site]))
