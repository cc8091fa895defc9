"""The import layers of pyproject.toml's [tool.importlinter] contracts hold (data -> featurize -> heads ->
cli; inside heads the core -> apply -> experiments; no circle between sibling modules), and importing the
command line loads no torch (so `cli --help` answers at once)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    if shutil.which("lint-imports") is None:
        pytest.skip("import-linter is not installed (the README set-up installs it with the test extra)")
    run = subprocess.run(["lint-imports"], cwd=ROOT, capture_output=True, text=True, env=os.environ.copy())
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def test_importing_the_cli_loads_no_torch():
    code = "import sys, headstore.cli; print(sorted(m for m in ('torch', 'transformers', 'faiss') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
