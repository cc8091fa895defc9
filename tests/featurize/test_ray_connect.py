"""`cli featurize --engine ray --address A` where no Ray cluster answers: one error line naming A, in
seconds (Ray alone retries a dead address for ~14 minutes). Run in a child process: the test session's
own Ray (the `ray_address` fixture) would otherwise be joined instead of A."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from featurize_helpers import random_texts

pytest.importorskip("ray")

CLI = "import sys; from headstore.cli import main; sys.exit(main())"


def test_an_address_where_no_ray_answers_is_one_error_line_in_seconds(tiny_model, tmp_path):
    data = tmp_path / "texts.txt"
    data.write_text("\n".join(random_texts(5, seed=3)) + "\n")
    store = tmp_path / "s"
    t0 = time.perf_counter()
    child = subprocess.run([sys.executable, "-c", CLI, "featurize", "--model", str(tiny_model), "--data", str(data),
                            "--store", str(store), "--engine", "ray", "--address", "127.0.0.1:1"],
                           capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - t0
    assert child.returncode == 2, child.stderr[-3000:]
    assert "Traceback" not in child.stderr
    last = child.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: --address 127.0.0.1:1: no Ray cluster answers there"), child.stderr[-3000:]
    assert "ray start --head" in last
    assert seconds < 60, seconds  # the CLI's start (torch, the model) and a refused connect; not Ray's retries
    assert not (store / "manifest.json").exists()  # nothing was written
