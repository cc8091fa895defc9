"""Shared fixtures for the data tests: where the real datasets live (skip when absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def datasets_root() -> Path:
    return Path(os.environ.get("HEADSTORE_DATA", REPO.parent / "shared" / "datasets"))


@pytest.fixture
def real_dataset():
    """real_dataset("scifact") -> path, or skip the test when that dataset is not present."""
    def find(name: str) -> Path:
        path = datasets_root() / name
        if not path.exists():
            pytest.skip(f"real dataset {path} not present (set HEADSTORE_DATA)")
        return path
    return find
