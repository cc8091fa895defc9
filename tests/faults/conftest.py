"""Fixtures of the fault suite (tests/faults): one tiny world per session, built in this process."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fault_child import start_server
from fault_matrix import size
from fault_world import TRAIN, assert_ok, cli, featurize_args, make_world, store_snapshot


IN_PROCESS_FIRST = ("test_fault_writes.py", "test_fault_suspicions.py", "test_fault_ray.py")


def pytest_collection_modifyitems(items):
    """The suite's tests that need no child run first (in this order, then the rest), so the children's fork
    server imports in the background meanwhile; tests outside tests/faults keep their places."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if here in Path(str(item.path)).parents]
    ours = [items[i] for i in slots]
    rank = {name: k for k, name in enumerate(IN_PROCESS_FIRST)}
    ours.sort(key=lambda item: rank.get(Path(str(item.path)).name, len(rank)))  # stable: ids keep their order
    for i, item in zip(slots, ours):
        items[i] = item


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
    start_server()  # the children's fork server imports what these runs imported, while in-process tests run
    return w


@pytest.fixture
def store_copy(world, tmp_path):
    """A copy of the world's store to damage."""
    target = tmp_path / "store"
    shutil.copytree(world["store"], target)
    return target
