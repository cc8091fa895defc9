"""Fixtures: a tiny random BERT saved to disk, and deterministic texts."""

from __future__ import annotations

import pytest
from featurize_helpers import build_tiny_bert, random_texts


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def texts() -> list[str]:
    return random_texts(60)
