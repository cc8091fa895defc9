"""`cli ARGS` in a real child process with a fault injected, forked from a warm server.

A fresh interpreter spends most of a tiny command importing torch and transformers (about 4 CPU-s of the
~6 a child featurize takes on a 2-core EPYC), and the suite starts 14 children; so the children are forked
from multiprocessing's fork server, which imported those modules once (and ran nothing: no thread pool
exists in it to be broken by the fork). Each child is still its own process: a real SIGKILL or SIGINT, its own
exit code (130 after Ctrl-C, -9 when killed), its own threads, stdout and stderr (files, read back by the
test), and nothing but imports shared with the test process.
"""
from __future__ import annotations

import multiprocessing
import os
import shutil
import sys
import tempfile
from pathlib import Path

from fault_inject import Fault, injected

PRELOAD_ROOTS = ("headstore", "torch", "transformers", "tokenizers", "safetensors", "zarr", "numcodecs", "numpy",
                 "scipy", "click", "huggingface_hub", "faiss", "sklearn", "pytest")  # not Ray: it starts threads
CHILD_ENV = {"TOKENIZERS_PARALLELISM": "false"}


def _context():
    """The fork-server context; its server, when it starts, imports what this process has imported of
    PRELOAD_ROOTS (by then the session's in-process runs have imported what the commands need)."""
    context = multiprocessing.get_context("forkserver")
    names = sorted(n for n in sys.modules if n.split(".")[0] in PRELOAD_ROOTS and "._" not in n)
    context.set_forkserver_preload(names)  # by name: the server has the default sys.path, not this one's
    return context


def _run(args: list[str], fault_spec: str, out: str, err: str) -> None:
    """The child: stdout and stderr to the files, the fault injected, `cli ARGS` (exits as the CLI exits)."""
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.environ.update(CHILD_ENV)
    with injected(Fault.parse(fault_spec)):
        from headstore.cli import main

        main(args=args, prog_name="cli")


class Child:
    """A running child, read like subprocess.Popen: poll(), communicate(timeout), returncode, stdout, stderr."""

    def __init__(self, args, fault: str):
        self._folder = Path(tempfile.mkdtemp(prefix="headstore-fault-child-"))
        self._out, self._err = self._folder / "stdout", self._folder / "stderr"
        self.process = _context().Process(
            target=_run, args=([str(a) for a in args], fault, str(self._out), str(self._err)))
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

