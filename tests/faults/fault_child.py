"""`cli ARGS` in a real child process with a fault injected, forked from a warm server.

A fresh interpreter spends most of a tiny command importing torch, transformers, matplotlib, sklearn, peft
(about 4 of the ~6 CPU-s a child featurize takes on a 2-core EPYC), and the suite starts 14 children; so
the children are forked from multiprocessing's fork server, which imported those modules once (what the
test process had imported by the time the world was built) and ran nothing: no thread pool of torch or
polars exists in it to be broken by the fork. Each child is still its own process: a real SIGKILL or SIGINT,
its own exit code (130 after Ctrl-C, -9 when killed), its own threads, stdout and stderr (files, read back
by the test), and nothing but imports shared with the test process.
"""
from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.forkserver
import os
import shutil
import sys
import tempfile
from pathlib import Path

from fault_inject import Fault, injected

HERE = Path(__file__).resolve().parent
PRELOAD_ENV = "HEADSTORE_FAULT_PRELOAD"  # the file naming the modules the server imports (one a line)
NOT_PRELOADED = ("ray", "pytest", "_pytest", "pluggy", "__main__", "__mp_main__")  # Ray starts threads
CHILD_ENV = {"TOKENIZERS_PARALLELISM": "false"}
_started: list[bool] = []


def _preloadable(name: str, module) -> bool:
    """A public module of a library (not one of the tests' own modules, nor Ray or pytest)."""
    path = getattr(module, "__file__", None) or ""
    return "._" not in name and name.split(".")[0] not in NOT_PRELOADED and not path.startswith(str(HERE.parent))


def start_server() -> None:
    """Start the fork server now (once): it imports, in the background, the modules this process has
    imported, in their order; the first child waits for it. The server finds this module (and so the
    listing) through PYTHONPATH: Python 3.11's fork server ignores the sys.path it is given."""
    if _started:
        return
    names = [name for name, module in list(sys.modules.items()) if _preloadable(name, module)]
    fd, listing = tempfile.mkstemp(prefix="headstore-fault-preload-", suffix=".txt")
    os.write(fd, "\n".join(names).encode())
    os.close(fd)
    saved = {key: os.environ.get(key) for key in (PRELOAD_ENV, "PYTHONPATH")}
    os.environ[PRELOAD_ENV] = listing
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), saved["PYTHONPATH"]) if p)
    try:
        multiprocessing.forkserver.set_forkserver_preload([Path(__file__).stem])
        multiprocessing.forkserver.ensure_running()
    finally:
        for key, value in saved.items():
            if value is None:
                del os.environ[key]
            else:
                os.environ[key] = value
    atexit.register(os.unlink, listing)  # read by the server when it starts
    _started.append(True)


def _preload() -> None:
    """In the fork server (which imports this module): import the modules listed; one that fails is left
    to the child that needs it."""
    listing = os.environ.get(PRELOAD_ENV)
    if not listing or not Path(listing).is_file():
        return
    for name in Path(listing).read_text().split():
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 -- any failure: the child imports it itself, if at all
            pass


def _run(args: list[str], fault_spec: str, out: str, err: str, environ: dict) -> None:
    """The child: the test process's environment, stdout and stderr to the files, the fault injected,
    `cli ARGS` (exits as the CLI exits)."""
    os.environ.clear()
    os.environ.update({**environ, **CHILD_ENV})
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    with injected(Fault.parse(fault_spec)):
        from headstore.cli import main

        main(args=args, prog_name="cli")


class Child:
    """A running child, read like subprocess.Popen: poll(), communicate(timeout), returncode, stdout, stderr."""

    def __init__(self, args, fault: str):
        self._folder = Path(tempfile.mkdtemp(prefix="headstore-fault-child-"))
        self._out, self._err = self._folder / "stdout", self._folder / "stderr"
        start_server()
        self.process = multiprocessing.get_context("forkserver").Process(
            target=_run, args=([str(a) for a in args], fault, str(self._out), str(self._err), dict(os.environ)))
        self.process.start()
        self.returncode = self.stdout = self.stderr = None

    def poll(self):
        return self.process.exitcode

    def communicate(self, timeout: float):
        """Wait for the end (AssertionError after `timeout` s: a hang, the child killed); (stdout, stderr)."""
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
            raise AssertionError(f"the child gave no answer within {timeout} s: a hang")
        self.returncode = self.process.exitcode
        self.stdout, self.stderr = self._out.read_text(), self._err.read_text()
        shutil.rmtree(self._folder, ignore_errors=True)
        return self.stdout, self.stderr


_preload()  # in the fork server; elsewhere there is no listing in the environment
