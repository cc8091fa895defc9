"""What a Ray worker runs for `cli grid --engine ray` (heads.experiments.grid.ray_engine): one stack per task.

`run_stack` gets references to the driver's detached StackRunner and to the feature matrix of the stack's array
(nested in a list, so Ray passes them unresolved), fetches each once per worker process (`_held`: on another node
the first fetch copies the object into that node's store, the one transfer over the network; every later fetch on
the node maps that copy), trains and scores the stack with the threads it asked for, and returns the result (its
weights on the CPU) with where and how long it ran. It writes nothing.

The matrices arrive read-only (numpy views of the node's shared copy). The tensors made of them share that memory,
so nothing here may write to them: the grid's training never does (heads.training.batches.prepare_data normalises
into a new tensor unless asked `in_place`, which the grid never asks); tests/heads/test_grid_ray.py checks every
node's copy after a grid.
"""
from __future__ import annotations

import os
import signal
import time
import warnings
from dataclasses import dataclass, replace

import numpy as np
import torch

from headstore.featurize.run.ray_cluster import environ

CRASH_ENV = "HEADSTORE_CRASH_AT"  # test hook (read by the driver, passed to the workers): see _maybe_crash
CRASH_MARKER_ENV = "HEADSTORE_CRASH_MARKER"
_HELD: dict[str, object] = {}  # in a worker process: the objects of the current grid it fetched (ref hex -> value)


@dataclass(frozen=True)
class StoreFacts:
    """What a detached runner knows of the store (it may not be reachable from a worker): its S.json fields."""
    path: str
    dim: int
    fingerprint: str
    manifest: dict
    n_texts: int


class SharedFeatures:
    """A detached runner's features: the matrices this worker holds for the grid, by array (`read`, as
    heads.artefacts.task_features.TaskFeatures reads), on `device`."""

    def __init__(self, device: str):
        self.device = device
        self.held: dict[str, torch.Tensor] = {}

    def read(self, array: str = "features") -> torch.Tensor:
        return self.held[array]


def run_stack(shared: list, index: int, items: list, array: str, call: dict) -> tuple:
    """One stack of the plan (`index`): (its StackResult, on the CPU; timing: node, pid, seconds getting the runner
    and the matrix, seconds training and scoring and the CPU seconds they took)."""
    import ray  # here: only a Ray worker runs this

    t0 = time.perf_counter()
    runner_ref, matrix_ref = shared
    runner = _held(ray, runner_ref, fresh=True)  # a worker's first: headstore's modules imported to unpickle it
    t_runner = time.perf_counter()
    runner.tf.held[array] = _held(ray, matrix_ref, device=runner.tf.device)
    t1 = time.perf_counter()
    torch.set_num_threads(call["threads"])
    cpu = time.process_time()
    with environ(call["env"]):
        result = runner.compute(items, array, progress=False)
    t2, cpu = time.perf_counter(), time.process_time() - cpu
    _maybe_crash(index, call["crash_at"], call["crash_marker"])
    result = replace(result, model=result.model.cpu(), norm=result.norm.to("cpu"))
    timing = {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "runner_seconds": t_runner - t0,
              "fetch_seconds": t1 - t_runner, "compute_seconds": t2 - t1, "cpu_seconds": cpu}
    return result, timing


def _held(ray, ref, device: str | None = None, fresh: bool = False):
    """The value of `ref`, fetched once per worker process; `fresh`: a runner not held yet is another grid's, and
    what this worker held for earlier grids is let go (the node's store may then free it)."""
    key = ref.hex()
    if key not in _HELD:
        if fresh:
            _HELD.clear()
        value = ray.get(ref)
        _HELD[key] = _tensor(value, device) if isinstance(value, np.ndarray) else value
    return _HELD[key]


def _tensor(matrix: np.ndarray, device: str | None) -> torch.Tensor:
    """A tensor sharing a read-only matrix of the object store (on a GPU: a copy in its memory)."""
    with warnings.catch_warnings():  # torch warns of a read-only array: nothing here writes to it (module doc)
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        t = torch.from_numpy(matrix)
    return t if device in (None, "cpu") else t.to(device)


def _maybe_crash(index: int, crash_at: str | None, marker: str | None) -> None:
    """Test hook: HEADSTORE_CRASH_AT='grid_stack:K' kills the worker that has just trained the plan's K-th stack
    (1-based), before it returns, once per marker file (HEADSTORE_CRASH_MARKER; Ray runs the stack again);
    'grid_stack_always:K' every time (the retries run out)."""
    if not crash_at:
        return
    point, _, k = crash_at.partition(":")
    if int(k or 1) != index + 1:
        return
    if point == "grid_stack_always":
        os.kill(os.getpid(), signal.SIGKILL)
    if point == "grid_stack" and marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)
