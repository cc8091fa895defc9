"""The import layers of pyproject.toml's [tool.importlinter] contracts hold (data -> featurize -> heads ->
cli; inside heads the core -> apply -> experiments; no circle between sibling modules), and importing the
command line loads no torch (so `cli --help` answers at once), and every package folder is in the wheel."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
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


def test_every_package_folder_is_listed_for_the_wheel():
    """pyproject.toml lists the packages by hand (the repository root is the package): a folder with an
    __init__.py missing from that list would be absent from a wheel or a non-editable install."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {"headstore"} | {
        "headstore." + ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("data", "featurize", "heads") for init in (ROOT / top).rglob("__init__.py")}
    assert folders - listed == set(), f"package folders missing from [tool.setuptools] packages: {sorted(folders - listed)}"
    assert listed - folders == set(), f"listed packages without a folder: {sorted(listed - folders)}"
