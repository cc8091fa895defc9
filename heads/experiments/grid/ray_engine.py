"""`cli grid --engine ray`: a grid's stacks on the workers of a Ray cluster, the features shared once per node.

This process (the driver) reads the inputs, plans the stacks and scores the frozen baselines as the local engine
does (heads.experiments.grid.run). It then puts in Ray's object store, once each, every feature matrix the stacks read
(float32, only the rows the task uses: heads.artefacts.task_features) and a copy of its StackRunner without files
or store (`StackRunner.detached`: the task, transfer and selection sets, anchors; the store's fingerprint and
manifest). Each stack is one Ray task (heads.experiments.grid.worker.run_stack) asking for `cpus_per_stack` CPUs
(its torch threads) and `gpus_per_stack` GPUs; its arguments are references, so a node receives each matrix once,
whatever the number of stacks it runs, and its workers map the node's copy read-only (a worker process keeps what
it fetched for the grid's later stacks). At most as many stacks are in flight as the cluster has slots for.

Longest first: with more than one slot the stacks are sent in the order of their modelled seconds, longest first
(heads.experiments.grid.estimate.stack_seconds: epochs x steps x the stack's head parameters, dev scoring and
re-mining; LPT scheduling), so that no slot is left training a long stack at the end while the others idle; ties
keep the plan's order. One slot keeps the plan's order: the local engine's. A stack's numbers do not depend on
which stacks ran before it in a worker (nothing is compiled: heads.training.stacked_adamw). Either way the driver
writes the rows in the plan's order.

One writer: a worker returns the stack's weights and rows; the driver alone writes the grid folder, the stack's
files then results.parquet (rows in the plan's order), as the local engine does, so a rerun skips finished stacks
whichever engine trained them. A worker or node that dies mid-stack has the stack run again by Ray (elsewhere if the
node is gone), `retries` times at most, then StackFailed names it; nothing of a failed stack is written. An error
of the stack's own (bad settings) is raised as the local engine raises it. Ctrl-C cancels the stacks in flight
(Ray kills their workers) and keeps what was saved. `ray.json` in the grid folder says where each stack ran, the
per-stack overhead (scheduling and transfers: a stack's time at the driver minus its time training and scoring)
and the object-store bytes per node.

Tasks, not long-lived actors: Ray reuses a worker process for the tasks after the first, and the worker keeps the
runner and matrices it fetched, so a task costs an actor call's overhead and ~16 ms more (bench/scale/grid_ray.py: 0.039
against 0.023 s a stack, the median after a worker's first stack); a task that dies is rescheduled on any node with
room, where a restarted actor waits for room of its own.
"""
from __future__ import annotations

import os
import statistics
import time
from collections import deque
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

from headstore.data.errors import SystemFailure
from headstore.data.files import atomic_write_json
from headstore.featurize.encoder.config import DEVICES
from headstore.featurize.run.ray_cluster import connect, ray_module
from headstore.heads.experiments.grid.estimate import plan_seconds
from headstore.heads.experiments.grid.worker import CRASH_ENV, CRASH_MARKER_ENV, SharedFeatures, StoreFacts, run_stack

STACK_RETRIES = 2  # a stack whose worker or node died is run again this often (Ray's max_retries), then StackFailed
PASSED_ENV: tuple[str, ...] = ()  # the driver's environment settings that change a stack's numbers, set likewise on
# its worker (none since the optimiser stopped compiling)
REPORT_FILE = "ray.json"


@dataclass(frozen=True)
class RayOptions:
    address: str | None = None  # None: start Ray on this machine; "auto": the cluster running here; HOST:PORT
    cpus_per_stack: int = 1  # a stack's torch threads and the CPUs it asks for: 1 runs the most stacks at once
    gpus_per_stack: float | None = None  # None: 1 with --device cuda (auto: when the cluster has GPUs), else 0
    retries: int = STACK_RETRIES

    def check(self) -> None:
        if self.cpus_per_stack < 1:
            raise ValueError(f"--cpus-per-stack must be at least 1, got {self.cpus_per_stack}")
        if self.gpus_per_stack is not None and self.gpus_per_stack < 0:
            raise ValueError(f"--gpus-per-stack must be >= 0, got {self.gpus_per_stack}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")


class StackFailed(SystemFailure):
    """A stack's worker or node died on every try (Ray's retries spent)."""


def ray_ready(options: RayOptions | None, device: str) -> RayOptions:
    """Ray started or joined, and the options completed (the GPUs a stack asks for): a bad option or a cluster
    without room for one stack is an error before the grid writes anything."""
    options = options or RayOptions()
    options.check()
    if device not in DEVICES:
        raise ValueError(f"--device {device!r}; valid: {', '.join(DEVICES)}")
    ray = ray_module()
    connect(ray, options.address)
    gpus = _gpus_per_stack(ray, options, device)
    if not _slots(ray, options.cpus_per_stack, gpus):
        have = ray.cluster_resources()
        raise ValueError(f"the Ray cluster has {have.get('CPU', 0):g} CPU(s) and {have.get('GPU', 0):g} GPU(s); a "
                         f"stack asks for {options.cpus_per_stack} CPU(s) and {gpus:g} GPU(s): ask for less "
                         "(--cpus-per-stack, --gpus-per-stack) or add nodes")
    return replace(options, gpus_per_stack=gpus)


def train_on_ray(runner, groups: dict, save: Callable[[int, object], None], options: RayOptions,
                 progress: bool) -> dict:
    """Train the plan's stacks (`groups`, heads.experiments.grid.plan.plan_stacks) on Ray (`options` from
    `ray_ready`); `save(i, result)` for each as it comes back (the driver's one write path). Returns what
    ray.json records ({} when nothing was left to train)."""
    stacks = list(groups.items())
    if not stacks:
        return {}
    ray, cpus, gpus = ray_module(), options.cpus_per_stack, options.gpus_per_stack
    for (_, _, array), _ in stacks:  # in the plan's order, as the local engine scores them
        runner.ensure_baseline(array)
    shared = _share(ray, runner, stacks, "cuda" if gpus else "cpu")
    call = {"threads": cpus, "env": {k: os.environ[k] for k in PASSED_ENV if k in os.environ},
            "crash_at": os.environ.get(CRASH_ENV), "crash_marker": os.environ.get(CRASH_MARKER_ENV)}
    remote = ray.remote(run_stack).options(num_cpus=cpus, num_gpus=gpus, max_retries=options.retries,
                                           retry_exceptions=False)
    modelled = plan_seconds(groups, runner.task, runner.store.dim)
    slots = partial(_slots, ray, cpus, gpus)  # asked again as nodes come and go
    n_slots = slots()
    order = submission_order(modelled, n_slots)
    t0 = time.perf_counter()
    timings = _run_all(ray, remote, stacks, order, shared, call, save, slots, options.retries)
    for t in timings:
        t["modelled_seconds"] = modelled[t["index"]]
    report = _report(ray, shared, timings, options, time.perf_counter() - t0)
    bound = speedup_bound([t["compute_seconds"] for t in timings], n_slots)
    report |= {"submission_order": order, "slots": n_slots, "speedup_bound": bound}
    atomic_write_json(runner.out / REPORT_FILE, report)
    if progress:
        print(_report_line(report))
    return report


def _gpus_per_stack(ray, options: RayOptions, device: str) -> float:
    """The GPUs a stack asks for: as given, else 1 for --device cuda (and auto on a cluster with GPUs), else 0."""
    gpus = options.gpus_per_stack
    if gpus is None:
        on_gpu = device == "cuda" or (device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)
        gpus = 1.0 if on_gpu else 0.0
    if device == "cpu" and gpus > 0:
        raise ValueError("--device cpu with --gpus-per-stack > 0: give one or the other")
    if device == "cuda" and not gpus:
        raise ValueError("--device cuda with --gpus-per-stack 0: the stacks would have no GPU")
    return float(gpus)


def submission_order(modelled: list[float], slots: int) -> list[int]:
    """The plan's stack indices in the order they go to the cluster: longest modelled first (ties in the plan's
    order) when `slots` > 1; the plan's order on one slot, where the order cannot shorten the grid (module doc)."""
    if slots <= 1:
        return list(range(len(modelled)))
    return sorted(range(len(modelled)), key=lambda i: (-modelled[i], i))


def speedup_bound(seconds: list[float], slots: int) -> float:
    """The most `slots` slots can speed up stacks taking `seconds` each over one slot, no stack split: their sum
    over the longer of the longest stack and an even share of the sum."""
    total = sum(seconds)
    return total / max(max(seconds), total / max(1, slots)) if total else 1.0


def _slots(ray, cpus: int, gpus: float) -> int:
    """How many stacks the cluster can run at once now."""
    have = ray.cluster_resources()
    n = int(have.get("CPU", 0) // cpus)
    return min(n, int(have.get("GPU", 0) // gpus)) if gpus else n


@dataclass
class _Shared:
    runner: object  # ObjectRef of the detached runner
    arrays: dict  # array name -> ObjectRef of its (n, D) float32 matrix
    sizes: dict  # array name -> bytes of the matrix


def _share(ray, runner, stacks: list, device: str) -> _Shared:
    """Every matrix the stacks read and the detached runner, put in the object store once."""
    arrays, sizes = {}, {}
    for (_, _, array), _ in stacks:
        if array not in arrays:
            matrix = runner.features(array).cpu().numpy()
            arrays[array], sizes[array] = ray.put(matrix), int(matrix.nbytes)
    store = runner.store
    facts = StoreFacts(str(store.path), store.dim, store.fingerprint, dict(store.manifest), store.n_texts)
    configs = [items[0][2] for _, items in stacks]
    twin = runner.detached(SharedFeatures(device), facts, configs)
    return _Shared(ray.put(twin), arrays, sizes)


def _run_all(ray, remote, stacks: list, order: list[int], shared: _Shared, call: dict, save, slots,
             retries: int) -> list[dict]:
    """Keep the cluster's slots busy with the plan's stacks, sent in `order`; save each as it returns. Any
    exception (a failed stack, Ctrl-C) cancels the stacks in flight before it goes on up."""
    queue, pending, timings = deque(order), {}, []
    try:
        while queue or pending:
            while queue and len(pending) < max(1, slots()):
                i = queue.popleft()
                (_, _, array), items = stacks[i]
                ref = remote.remote([shared.runner, shared.arrays[array]], i, items, array, call)
                pending[ref] = (i, time.perf_counter())
            [ref], _ = ray.wait(list(pending), num_returns=1)
            i, sent = pending.pop(ref)
            result, timing = _result(ray, ref, stacks[i], i, len(stacks), retries, len(timings))
            timing.update(index=i, stack=result.stack, latency_seconds=time.perf_counter() - sent)
            save(i, result)
            timings.append(timing)
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    return timings


def _result(ray, ref, stack: tuple, i: int, n: int, retries: int, n_saved: int):
    """A finished stack's (result, timing); its own error raised as the local engine raises it; StackFailed when
    its worker or node died on every try."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:  # the stack's code raised: bad settings, a diverged loss, ...
        if isinstance(err.cause, Exception):
            raise err.cause from None
        raise
    except ray.exceptions.RayError as err:  # WorkerCrashedError, NodeDiedError, OutOfMemoryError, ...
        (_, _, array), items = stack
        what = (str(err).strip().splitlines() or [""])[0][:200]
        raise StackFailed(
            f"--engine ray: stack {i + 1} of {n} ({len(items)} head(s), loss {items[0][2].loss}, array {array}, "
            f"first head {items[0][0]}) failed {retries + 1} time(s), its worker or node dying each time "
            f"({type(err).__name__}: {what}); the {n_saved} stack(s) finished are saved: run the same command again "
            "to go on (or with --engine local)") from None


def _report(ray, shared: _Shared, timings: list[dict], options: RayOptions, seconds: float) -> dict:
    """What ray.json records: each stack's node, times and overhead; the shared objects' copies and bytes per node."""
    for t in timings:
        t["overhead_seconds"] = max(0.0, t["latency_seconds"] - t["compute_seconds"])
    refs = {"runner": shared.runner, **shared.arrays}
    where = ray.experimental.get_object_locations(list(refs.values()))
    objects = {name: {"bytes": int(where[ref]["object_size"] or 0), "nodes": sorted(where[ref]["node_ids"])}
               for name, ref in refs.items()}
    per_node: dict[str, int] = {}
    for obj in objects.values():
        for node in obj["nodes"]:
            per_node[node] = per_node.get(node, 0) + obj["bytes"]
    overheads = [t["overhead_seconds"] for t in timings] or [0.0]
    compute = sum(t["compute_seconds"] for t in timings)
    return {"engine": "ray", "address": options.address, "cpus_per_stack": options.cpus_per_stack,
            "gpus_per_stack": options.gpus_per_stack, "retries": options.retries, "seconds": round(seconds, 3),
            "nodes": len({t["node"] for t in timings}), "stacks": sorted(timings, key=lambda t: t["index"]),
            "features_bytes": dict(shared.sizes), "objects": objects, "object_store_bytes_per_node": per_node,
            "overhead_seconds_median": statistics.median(overheads), "overhead_seconds_mean": statistics.fmean(overheads),
            "overhead_share": sum(overheads) / compute if compute else 0.0}


def _report_line(report: dict) -> str:
    mb = sum(report["features_bytes"].values()) / 1e6
    copies = max(len(o["nodes"]) for name, o in report["objects"].items() if name != "runner")
    order = "longest first" if report["slots"] > 1 else "in the plan's order"
    return (f"ray: {len(report['stacks'])} stack(s) on {report['nodes']} node(s) in {report['seconds']:.1f} s, sent "
            f"{order} to {report['slots']} slot(s) (at most {report['speedup_bound']:.2f}x faster than one slot, "
            f"whole stacks); features {mb:.1f} MB put once, held by {copies} node(s); overhead per stack "
            f"{report['overhead_seconds_median']:.3f} s median ({100 * report['overhead_share']:.1f}% of the stacks' "
            f"time); {REPORT_FILE}")
