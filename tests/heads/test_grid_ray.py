"""`cli grid --engine ray` on a Ray cluster of 2 simulated nodes (`ray.cluster_utils.Cluster`, 1 CPU each; a third
for the node-loss case), shared by the module's tests: every Ray worker imports torch, so few workers and quick
grids. The reference is the local engine on the same grid with the same torch threads (1)."""
from __future__ import annotations

import json
import threading
import time

import numpy as np
import polars as pl
import pytest
import torch
from safetensors import safe_open

from .conftest import assert_bad_input, cli

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

import headstore.heads.experiments.grid.ray_engine as grid_ray  # noqa: E402
from headstore.heads.experiments.grid.run import run_grid  # noqa: E402
from headstore.heads.experiments.grid.ray_engine import RayOptions, StackFailed  # noqa: E402

GRID = ('[grid]\nloss = ["l1-energy", "mnr"]\ndepth = [1, 2]\nlr = [1e-3, 3e-3]\nseed = [0, 1]\n'
        '[fixed]\nepochs = 2\nhidden = 16\nbatch_size = 8\nmined_k = 2\n')  # 4 stacks of 4 heads
TIMING = ("train_seconds", "eval_seconds")  # the only columns allowed to differ between two runs
NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20}


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    c.add_node(**NODE)
    if ray.is_initialized():  # an earlier test of the run (featurize's Ray engine) left this process connected
        ray.shutdown()
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def runs(data_world, cluster, tmp_path_factory):
    """The grid trained by the local engine (1 torch thread) and by the ray engine (its shared objects kept)."""
    root = tmp_path_factory.mktemp("grid-ray")
    (root / "grid.toml").write_text(GRID)
    w = {"root": root, "grid": root / "grid.toml", "local": root / "local", "ray": root / "ray", "shared": []}
    args = (data_world["store"], data_world["pos"], w["grid"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_grid(*args, str(w["local"]), progress=False, ensembles=(2,), soups=(2,))
    finally:
        torch.set_num_threads(threads)
    share = grid_ray._share
    with pytest.MonkeyPatch.context() as mp:  # keep the shared objects alive to look at them after the grid
        mp.setattr(grid_ray, "_share", lambda *a: w["shared"].append(share(*a)) or w["shared"][-1])
        r = cli("grid", "--store", data_world["store"], "--data", data_world["pos"], "--grid", w["grid"],
                "--out", w["ray"], "--engine", "ray", "--address", cluster.address, "--ensemble", "2", "--soup", "2")
    assert r.exit_code == 0, r.output
    return w


@pytest.mark.parametrize("option", [("--address", "auto"), ("--cpus-per-stack", "2"), ("--gpus-per-stack", "1")])
def test_the_ray_options_without_the_ray_engine_are_refused(data_world, tmp_path, option):
    (tmp_path / "grid.toml").write_text(GRID)
    r = cli("grid", "--store", data_world["store"], "--data", data_world["pos"], "--grid", tmp_path / "grid.toml",
            "--out", tmp_path / "g", *option)
    assert_bad_input(r, "--address, --cpus-per-stack and --gpus-per-stack are for --engine ray")
    assert not (tmp_path / "g").exists()


def results(out) -> pl.DataFrame:
    return pl.read_parquet(out / "results.parquet").drop(TIMING)


def assert_same_grid(out, reference) -> None:
    """The same rows (every figure, in the same order; so the same leaderboard) and weights as the reference."""
    assert results(out).equals(results(reference))
    names = sorted(p.name for p in (reference / "heads").iterdir())
    assert sorted(p.name for p in (out / "heads").iterdir()) == names
    for name in names:  # safetensors orders its metadata by a per-process hash: compare what the files hold
        if name.endswith(".json"):
            assert json.loads((out / "heads" / name).read_text()) == json.loads((reference / "heads" / name).read_text())
            continue
        with safe_open(str(out / "heads" / name), "pt") as got, safe_open(str(reference / "heads" / name), "pt") as ref:
            assert got.metadata() == ref.metadata() and sorted(got.keys()) == sorted(ref.keys()), name
            for key in ref.keys():
                assert torch.equal(got.get_tensor(key), ref.get_tensor(key)), (name, key)


def test_the_ray_engine_gives_the_local_engines_grid_bit_for_bit(runs):
    assert_same_grid(runs["ray"], runs["local"])
    assert (runs["ray"] / "leaderboard.md").read_text() == (runs["local"] / "leaderboard.md").read_text()
    for name in ("ensembles.json", "soups.json", "baseline.json"):
        assert json.loads((runs["ray"] / name).read_text()) == json.loads((runs["local"] / name).read_text()), name
    report = json.loads((runs["ray"] / "ray.json").read_text())
    assert report["nodes"] == 2 and len(report["stacks"]) == 4  # two 1-CPU nodes, one stack each at a time
    held = report["objects"]["features"]
    assert len(held["nodes"]) == 2 and held["bytes"] >= report["features_bytes"]["features"]  # one copy per node
    for node, size in report["object_store_bytes_per_node"].items():
        assert size == held["bytes"] + report["objects"]["runner"]["bytes"], node


def test_the_stacks_go_to_two_slots_longest_first_the_rows_in_the_plans_order(runs):
    report = json.loads((runs["ray"] / "ray.json").read_text())
    plan = list(dict.fromkeys(pl.read_parquet(runs["local"] / "results.parquet")["stack"]))  # the local order
    by_index = {s["index"]: s for s in report["stacks"]}
    assert [by_index[i]["stack"] for i in range(len(plan))] == plan
    order = report["submission_order"]
    assert report["slots"] == 2 and sorted(order) == list(range(4))
    # the reference: a stack of depth 2 (one more 16 x 16 layer per head, all else alike) costs more than its depth-1
    # twin, so both depth-2 stacks go first; the plan has them 2nd and 4th, so this grid ran out of the plan's order
    depth = {row["stack"]: row["depth"] for row in results(runs["local"]).iter_rows(named=True)}
    assert [depth[plan[i]] for i in order] == [2, 2, 1, 1] and order != sorted(order)
    modelled = [by_index[i]["modelled_seconds"] for i in order]
    assert modelled == sorted(modelled, reverse=True)
    # (the same rows, leaderboard and weights as the local engine's: the bit-for-bit test above, on this run)


def test_one_slot_keeps_the_plans_order_and_ties_keep_it_too():
    assert grid_ray.submission_order([1.0, 5.0, 3.0], 1) == [0, 1, 2]
    assert grid_ray.submission_order([1.0, 5.0, 3.0, 5.0, 1.0], 2) == [1, 3, 2, 0, 4]


def test_the_speedup_bound_is_never_beaten_by_any_split_of_whole_stacks():
    import itertools
    import random

    rng = random.Random(0)
    for _ in range(200):
        seconds = [rng.choice([0.5, 1.0, 3.0, 10.0]) * rng.random() for _ in range(rng.randint(1, 7))]
        slots = rng.randint(1, 3)
        best = min(max(sum(s for s, k in zip(seconds, assign) if k == j) for j in range(slots))  # every assignment
                   for assign in itertools.product(range(slots), repeat=len(seconds)))
        assert grid_ray.speedup_bound(seconds, slots) >= sum(seconds) / best - 1e-9
    assert grid_ray.speedup_bound([30.0, 5.0, 5.0], 2) == pytest.approx(40 / 30)  # one stack longer than the rest
    assert grid_ray.speedup_bound([1.0] * 6, 2) == pytest.approx(2.0)


def test_eval_reads_a_grid_trained_on_ray_as_one_trained_locally(runs, data_world, tmp_path):
    metrics = {}
    for engine in ("local", "ray"):
        out = tmp_path / engine
        r = cli("eval", "--store", data_world["store"], "--head", f"{runs[engine]}#rank=1", "--data",
                data_world["pos"], "--out", out)
        assert r.exit_code == 0, r.output
        metrics[engine] = json.loads((out / "metrics.json").read_text())["head"]
    assert metrics["ray"] == metrics["local"]


def test_no_stack_writes_to_the_shared_features(runs, data_world, cluster):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from headstore.featurize.store.reader import FeatureStore
    from headstore.heads.artefacts.task_features import TaskFeatures
    from headstore.heads.kinds import load_task

    ref = runs["shared"][0].arrays["features"]
    store = FeatureStore.open(data_world["store"])
    expected = TaskFeatures.for_task(store, load_task(str(data_world["pos"]), store)).read("features").numpy()
    copy = ray.get(ref)
    assert not copy.flags.writeable  # what a worker gets: a read-only view of its node's copy

    @ray.remote(num_cpus=0)
    def content(refs):
        return np.asarray(ray.get(refs[0])).tobytes()

    nodes = ray.experimental.get_object_locations([ref])[ref]["node_ids"]
    assert len(nodes) == 2
    for node in nodes:  # every node's copy as it is after the grid: the store's rows, unchanged
        strategy = NodeAffinitySchedulingStrategy(node, soft=False)
        assert ray.get(content.options(scheduling_strategy=strategy).remote([ref])) == expected.tobytes()


def _ray_grid(data_world, runs, out, **options):
    return run_grid(data_world["store"], data_world["pos"], runs["grid"], str(out), progress=False,
                    engine="ray", ray_options=RayOptions(**options))


def test_a_cluster_without_room_for_a_stack_is_refused_before_anything_is_written(runs, data_world, tmp_path):
    with pytest.raises(ValueError, match=r"has 2 CPU\(s\) and 0 GPU\(s\); a stack asks for 1 CPU\(s\) and 1 GPU"):
        run_grid(data_world["store"], data_world["pos"], runs["grid"], str(tmp_path / "g"), progress=False,
                 engine="ray", device="cuda")
    with pytest.raises(ValueError, match="has 2 CPU.* a stack asks for 3 CPU"):
        _ray_grid(data_world, runs, tmp_path / "g", cpus_per_stack=3)
    assert not (tmp_path / "g").exists()


def test_a_rerun_trains_only_the_stacks_not_finished(runs, data_world, tmp_path):
    import shutil

    out = tmp_path / "g"
    shutil.copytree(runs["ray"], out)
    frame = pl.read_parquet(out / "results.parquet")
    last = frame["stack"][-1]
    frame.filter(pl.col("stack") != last).write_parquet(out / "results.parquet")  # as if stopped before it
    before = {p.name: p.stat().st_mtime_ns for p in (out / "heads").iterdir() if not p.name.startswith(last)}
    _ray_grid(data_world, runs, out)
    report = json.loads((out / "ray.json").read_text())
    assert [s["stack"] for s in report["stacks"]] == [last]  # the one stack not finished, and only it
    assert {p: (out / "heads" / p).stat().st_mtime_ns for p in before} == before
    assert_same_grid(out, runs["local"])


def test_a_worker_killed_mid_stack_has_its_stack_run_again(runs, data_world, tmp_path, monkeypatch):
    marker = tmp_path / "killed"
    monkeypatch.setenv("HEADSTORE_CRASH_AT", "grid_stack:2")  # the worker dies once the 2nd stack has trained
    monkeypatch.setenv("HEADSTORE_CRASH_MARKER", str(marker))
    _ray_grid(data_world, runs, tmp_path / "g")
    assert marker.exists()
    assert_same_grid(tmp_path / "g", runs["local"])


def test_a_stack_whose_workers_always_die_ends_the_grid_naming_it(runs, data_world, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSTORE_CRASH_AT", "grid_stack_always:1")
    out = tmp_path / "g"
    first = pl.read_parquet(runs["local"] / "results.parquet")["stack"][0]
    with pytest.raises(StackFailed, match=f"stack 1 of 4 .*first head {first}.* failed 2 time"):
        _ray_grid(data_world, runs, out, retries=1)
    assert not any(p.name.startswith(first) for p in (out / "heads").iterdir())  # nothing of it written
    if (out / "results.parquet").is_file():
        assert first not in pl.read_parquet(out / "results.parquet")["stack"].to_list()


def _running_stacks(node) -> list:
    """The worker processes of `node` (a cluster_utils node) running a stack now (Ray titles them by task)."""
    raylet = _raylet(node)
    if raylet is None:  # the node's raylet is gone: nothing runs there
        return []
    return [p for p in raylet.children(recursive=True) if "run_stack" in " ".join(_cmdline(p))]


def _raylet(node):
    """`node`'s raylet process: as cluster_utils recorded it, else found by its node id (in a whole-suite
    run a node's record once lacked its "raylet" entry, and the KeyError silently ended the test's polling thread)."""
    import psutil

    recorded = node.all_processes.get("raylet")
    if recorded and psutil.pid_exists(recorded[0].process.pid):
        return psutil.Process(recorded[0].process.pid)
    flag = f"--node_id={node.node_id}"
    return next((p for p in psutil.process_iter(["name", "cmdline"])  # a process gone meanwhile: info None
                 if p.info["name"] == "raylet" and flag in (p.info["cmdline"] or [])), None)


def _cmdline(p) -> list:
    try:
        return p.cmdline()
    except Exception:  # the process ended meanwhile
        return []


ISOLATED_ENV = "HEADSTORE_TEST_ISOLATED"
# These two watch Ray's worker processes (a stack's worker, titled by its task, under its node's raylet). In a
# whole-suite run (1,150 tests before them in one interpreter) they saw no worker at all, twice, while the grid ran
# on the cluster; alone or beside every other Ray test they pass. So each runs in a fresh interpreter, started by
# test_the_process_watching_tests_in_their_own_interpreter below.
isolated = pytest.mark.skipif(not __import__("os").environ.get(ISOLATED_ENV),
                              reason="run in its own interpreter by test_the_process_watching_tests_in_their_own_interpreter")


def test_the_process_watching_tests_in_their_own_interpreter():
    import os
    import subprocess
    import sys

    names = "test_ctrl_c_stops_the_stacks_in_flight or test_a_node_lost_mid_grid_leaves_its_stack_to_the_others"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", names],
                          env={**os.environ, ISOLATED_ENV: "1"}, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


@isolated
def test_ctrl_c_stops_the_stacks_in_flight(runs, data_world, tmp_path, cluster):
    import _thread

    import psutil

    slow = tmp_path / "slow.toml"  # stacks of a few seconds: still running when Ctrl-C comes
    slow.write_text(GRID.replace("epochs = 2", "epochs = 500\npatience = 500"))
    running = []

    def press_ctrl_c():
        deadline = time.monotonic() + 300
        while not running and time.monotonic() < deadline:
            running.extend(p for n in cluster.list_all_nodes() for p in _running_stacks(n))
            time.sleep(0.05)
        _thread.interrupt_main()  # as a SIGINT to this process

    threading.Thread(target=press_ctrl_c, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_grid(data_world["store"], data_world["pos"], slow, str(tmp_path / "g"), progress=False, engine="ray")
    assert running
    gone = psutil.wait_procs(running, timeout=20)[0]  # their workers were killed, not left to finish the stack
    assert len(gone) == len(running)


@isolated
def test_a_node_lost_mid_grid_leaves_its_stack_to_the_others(runs, data_world, tmp_path, cluster):
    doomed = cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    removed = threading.Event()

    def remove_when_busy():
        deadline = time.monotonic() + 300
        while not _running_stacks(doomed) and time.monotonic() < deadline:
            time.sleep(0.05)
        cluster.remove_node(doomed)  # while it runs a stack: the stack dies with it
        removed.set()

    thread = threading.Thread(target=remove_when_busy, daemon=True)
    thread.start()
    _ray_grid(data_world, runs, tmp_path / "g")
    thread.join(timeout=60)
    assert removed.is_set()
    assert_same_grid(tmp_path / "g", runs["local"])
