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


@pytest.fixture(scope="session")
def ray_address():
    """One real local Ray for the whole test run (2 CPUs); its address for child drivers."""
    ray = pytest.importorskip("ray")
    context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield context.address_info["address"]
    ray.shutdown()
