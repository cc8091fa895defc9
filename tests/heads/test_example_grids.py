"""Every grid file the project ships (examples/, the studies' configs) reads as `cli grid` reads it: a check of
the grid-file rules (a setting in both [fixed] and a grid table is refused) once caught a study config that no
longer ran as written."""
from pathlib import Path

import pytest

from headstore.heads.experiments.grid.spec import read_grid

ROOT = Path(__file__).resolve().parents[2]
GRID_FILES = sorted(p for p in (ROOT / "examples").rglob("*.toml")
                    if "[grid]" in p.read_text() or "[[grids]]" in p.read_text())


def test_the_examples_hold_grid_files():
    assert (ROOT / "examples" / "grid.toml") in GRID_FILES and len(GRID_FILES) > 5


@pytest.mark.parametrize("path", GRID_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_shipped_grid_file_reads(path):
    combos = read_grid(str(path))
    assert combos and all(isinstance(c, dict) for c in combos)
