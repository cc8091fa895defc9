"""Fixtures of the fault suite (tests/faults): one tiny world per session, built in this process."""
from __future__ import annotations

import shutil

import pytest
from fault_matrix import size
from fault_world import TRAIN, assert_ok, cli, featurize_args, make_world, store_snapshot


def pytest_terminal_summary(terminalreporter):
    """The suite's size (the issue asks for it: sites × faults × seeds) under the run's summary."""
    terminalreporter.write_line(size())


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> dict:
    """The model, pairs table, grid file; a store of the pairs (and its snapshot), a head, a grid's output."""
    w = make_world(tmp_path_factory.mktemp("faults"))
    w["store"] = w["root"] / "store"
    assert_ok(cli(*featurize_args(w, w["store"])))
    w["snapshot"] = store_snapshot(w["store"])
    w["head"] = w["root"] / "head"
    assert_ok(cli("train-head", "--store", w["store"], "--data", w["pairs"], "--out", w["head"], *TRAIN))
    return w


@pytest.fixture
def store_copy(world, tmp_path):
    """A copy of the world's store to damage."""
    target = tmp_path / "store"
    shutil.copytree(world["store"], target)
    return target
