"""Session fixtures shared by the heads tests."""
import pytest

from .api_world import World


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> World:
    """A tiny random BERT, a BEIR folder, a float32 store of it and a trained head (see api_world)."""
    return World(tmp_path_factory.mktemp("api-world"))
