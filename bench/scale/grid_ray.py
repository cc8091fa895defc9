"""Benchmark: `cli grid --engine ray` on simulated Ray nodes against the local engine, on one machine.

1. Scaling: the same grid (default: the main job's 144-configuration STS-B grid, examples/grid.toml) run by
   `cli grid` in a child process: the local engine (torch's default threads: every core), then `--engine ray`
   joining a `ray.cluster_utils.Cluster` of 1 node x 1 CPU and of 2 nodes x 1 CPU (a fresh cluster each, so
   each pays its workers' start: torch's import, a compile). Per run: the command's seconds, the seconds the
   stacks took (ray.json), the speed-up, the per-stack overhead (a stack's time at the driver minus its time
   training and scoring: scheduling, fetching the features, sending the weights back), the object-store bytes
   per node against the features' size, and whether every row equals the local engine's.
2. Unit of work (--units): a short grid (one epoch, one seed) on 2 nodes x 1 CPU, each stack a Ray task (the
   engine's way) or a call on a long-lived actor per node (the same worker code, heads.experiments.grid.worker),
   in this process: the per-stack overhead of each.

    python bench/scale/grid_ray.py --store /tmp/store-stsb --data ../shared/datasets/stsb --json runs/bench-grid-ray.json

A large task (the 1 M-document synthetic BEIR set of bench/scale/scale_heads.py): one cluster, no local run, an
object store per node large enough for the features (1M x 384 float32: 1.5 GB) and the results:

    python bench/scale/grid_ray.py --store S --data BEIR --grid G --clusters 2x1 --no-local --units '' \
        --node-store-mb 2500

--fetch-rows N also times, alone, the first fetch of an (N, 384) float32 matrix on the second of 2 nodes (1002700: the
1 M-document set's features, 1.54 GB; --node-store-mb 2000), where a run of the whole grid would not fit in memory.

Memory, polled every 0.2 s over this process's tree (the cluster's processes, the `cli grid` child): the peak RSS of
the driver and of the largest worker (each counts the node's shared copy it maps), and the peak of the tree's
private memory (RssAnon) plus /dev/shm in use (where the object stores keep their objects). The machine's load
average is printed beside every figure: on a shared machine it moves them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))  # bench/speed/featurize.py

from featurize import device_name  # noqa: E402

CLI = "import sys; from headstore.cli import main; sys.exit(main())"
TIMING = ("train_seconds", "eval_seconds")
NODE_STORE_MB = 256  # STS-B's features are ~26 MB; the store holds them and the results (--node-store-mb)


def start_cluster(nodes: int, cpus: int):
    from ray.cluster_utils import Cluster

    node = {"object_store_memory": NODE_STORE_MB * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "include_dashboard": False, **node})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=cpus, **node)
    cluster.wait_for_nodes()
    return cluster


def _status(pid: int) -> dict:
    """A process's /proc status lines in kB (VmRSS, RssAnon, ...), its command line under "cmd"."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if value.strip().endswith("kB"):
                out[key] = int(value.split()[0]) * 1024
        out["cmd"] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return {}
    return out


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    pids, todo = [], [root]
    while todo:
        pids.append(todo.pop())
        todo += children.get(pids[-1], [])
    return pids


def poll_memory(driver: int, stop: threading.Event, peaks: dict) -> None:
    """Until `stop`: the peak RSS of the driver (pid `driver`) and of the largest Ray worker running a stack, and
    the peak of this tree's private memory plus /dev/shm in use (module doc)."""
    while not stop.is_set():
        anon = 0
        for pid in _tree(os.getpid()):
            st = _status(pid)
            anon += st.get("RssAnon", 0)
            if pid == driver:
                peaks["driver_rss"] = max(peaks.get("driver_rss", 0), st.get("VmRSS", 0))
            elif "run_stack" in st.get("cmd", ""):
                peaks["worker_rss"] = max(peaks.get("worker_rss", 0), st.get("VmRSS", 0))
        shm = os.statvfs("/dev/shm")
        peaks["private_plus_shm"] = max(peaks.get("private_plus_shm", 0),
                                        anon + (shm.f_blocks - shm.f_bfree) * shm.f_frsize)
        stop.wait(0.2)


def run_cli(args: argparse.Namespace, out: Path, *extra: str) -> dict:
    """`cli grid` in a child process; its seconds, the load average around it and the peak memory (poll_memory)."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", CLI, "grid", "--store", args.store, "--data", args.data,
                              "--grid", args.grid, "--out", str(out), *extra], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "HEADSTORE_PROGRESS": "off"})
    stop, peaks = threading.Event(), {}
    poller = threading.Thread(target=poll_memory, args=(child.pid, stop, peaks), daemon=True)
    poller.start()
    _, stderr = child.communicate()
    seconds = time.perf_counter() - t0
    stop.set()
    poller.join()
    if child.returncode:
        raise SystemExit(f"cli grid {' '.join(extra)} failed:\n{stderr[-3000:]}")
    return {"seconds": round(seconds, 1), "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2),
            "peak_mb": {k: round(v / 2**20) for k, v in peaks.items()}}


def same_rows(out: Path, reference: Path) -> dict:
    """How many rows equal the reference's exactly (timing columns aside) and the largest difference."""
    import polars as pl

    a = pl.read_parquet(out / "results.parquet").drop(TIMING)
    b = pl.read_parquet(reference / "results.parquet").drop(TIMING)
    equal = sum(x == y for x, y in zip(a.to_dicts(), b.to_dicts()))
    numeric = [c for c in b.columns if b[c].dtype.is_float() and c in a.columns]
    diff = max((float((a[c] - b[c]).abs().max() or 0.0) for c in numeric), default=0.0)
    return {"rows": b.height, "rows_equal": equal, "max_abs_diff": diff}


def ray_figures(out: Path) -> dict:
    report = json.loads((out / "ray.json").read_text())
    stacks = report["stacks"]
    return {k: report[k] for k in ("seconds", "nodes", "overhead_seconds_median", "overhead_seconds_mean",
                                   "overhead_share", "features_bytes", "object_store_bytes_per_node")} | {
        "stacks": len(stacks), "fetch_seconds_max": max(s["fetch_seconds"] for s in stacks),
        "runner_seconds_max": max(s["runner_seconds"] for s in stacks),
        "cpu_seconds": sum(s["cpu_seconds"] for s in stacks), "compute_seconds": sum(s["compute_seconds"] for s in stacks),
        "slots": report.get("slots"), "speedup_bound": report.get("speedup_bound"),
        "submission_order": report.get("submission_order"),
        "per_stack": [{k: s.get(k) for k in ("index", "node", "compute_seconds", "modelled_seconds", "overhead_seconds",
                                             "runner_seconds", "fetch_seconds", "cpu_seconds")} for s in stacks]}


def scaling(args: argparse.Namespace, root: Path) -> list[dict]:
    """The local engine (once: a kept folder's earlier run is reused; none with --no-local), then the clusters
    of --clusters in turn."""
    local, saved = root / "local", root / "local" / "bench-local.json"
    if not args.no_local and not saved.is_file():
        row = {"run": "local engine", "nodes": 1, "cpus": os.cpu_count(), **run_cli(args, local)}
        saved.write_text(json.dumps(row))
    rows = [] if args.no_local else [json.loads(saved.read_text())]
    clusters = [tuple(int(x) for x in c.split("x")) for c in args.clusters.split(",")]
    for nodes, cpus in clusters * args.repeats:
        cluster = start_cluster(nodes, cpus)
        try:
            out = root / f"ray-{nodes}x{cpus}-{len(rows)}"
            row = {"run": f"ray {nodes} node(s) x {cpus} CPU", "nodes": nodes, "cpus": cpus,
                   **run_cli(args, out, "--engine", "ray", "--address", cluster.address)}
        finally:
            cluster.shutdown()
        row["ray"] = ray_figures(out)
        if not args.no_local:
            row["same_as_local"] = same_rows(out, local)
        if nodes > 1 and rows and rows[-1].get("nodes") == 1 and "ray" in rows[-1]:  # against the 1x1 run before
            row["speedup"] = rows[-1]["seconds"] / row["seconds"]
            row["stack_speedup"] = rows[-1]["ray"]["seconds"] / row["ray"]["seconds"]
        rows.append(row)
    return rows


class StackActor:
    """A long-lived actor per node: the engine's worker code (its per-process holding included), called per stack."""

    def run(self, *args):
        from headstore.heads.experiments.grid.worker import run_stack

        return run_stack(*args)


def actor_run_all(ray, remote, stacks, order, shared, call, save, slots, retries):
    """grid_ray._run_all with one actor per slot instead of a task per stack."""
    actors = deque(ray.remote(StackActor).options(num_cpus=call["threads"]).remote() for _ in range(slots()))
    queue, pending, timings = deque(order), {}, []
    while queue or pending:
        while queue and actors:
            actor, i = actors.popleft(), queue.popleft()
            (_, _, array), items = stacks[i]
            ref = actor.run.remote([shared.runner, shared.arrays[array]], i, items, array, call)
            pending[ref] = (i, actor, time.perf_counter())
        [ref], _ = ray.wait(list(pending), num_returns=1)
        i, actor, sent = pending.pop(ref)
        result, timing = ray.get(ref)
        timing.update(index=i, stack=result.stack, latency_seconds=time.perf_counter() - sent)
        save(i, result)
        timings.append(timing)
        actors.append(actor)
    return timings


def units(args: argparse.Namespace, root: Path) -> list[dict]:
    """Task per stack vs actor per node on a short grid (2 nodes x 1 CPU, a fresh cluster each)."""
    import ray

    import headstore.heads.experiments.grid.ray_engine as grid_ray
    from headstore.heads.experiments.grid.run import run_grid

    short = root / "short.toml"
    short.write_text(Path(args.grid).read_text().replace("epochs = 5", "epochs = 1")
                     .replace("seed = [0, 1, 2]", "seed = [0]"))
    rows, tasks = [], grid_ray._run_all
    for unit in args.units.split(","):
        cluster = start_cluster(2, 1)
        ray.init(address=cluster.address, log_to_driver=False)
        grid_ray._run_all = actor_run_all if unit == "actor" else tasks
        load = os.getloadavg()[0]
        try:
            run_grid(args.store, args.data, str(short), str(root / f"unit-{unit}"), progress=False, engine="ray")
        finally:
            grid_ray._run_all = tasks
            ray.shutdown()
            cluster.shutdown()
        rows.append({"unit": unit, "load_before": round(load, 2), **ray_figures(root / f"unit-{unit}")})
    return rows


def _fetch(refs) -> float:
    """Seconds a task takes to get its matrix (a Ray task, bench only)."""
    import ray

    t0 = time.perf_counter()
    ray.get(refs[0])
    return time.perf_counter() - t0


def fetch_check(rows: int) -> list[dict]:
    """The first fetch of a (rows, 384) float32 matrix (a task's features) by a task on the other node of a 2-node
    cluster, then again there and on the head node (both map a copy already there): seconds, and the load."""
    import numpy as np
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cluster = start_cluster(2, 1)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        matrix = np.random.default_rng(0).standard_normal((rows, 384), dtype=np.float32)
        t0 = time.perf_counter()
        ref = ray.put(matrix)
        put_seconds = time.perf_counter() - t0
        del matrix  # the store's copy only
        fetch = ray.remote(num_cpus=1)(_fetch)
        head = ray.get_runtime_context().get_node_id()
        other = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != head)
        out = []
        for k, (where, node) in enumerate((("other node", other), ("other node", other), ("head node", head))):
            load = os.getloadavg()[0]
            strategy = NodeAffinitySchedulingStrategy(node, soft=False)
            seconds = ray.get(fetch.options(scheduling_strategy=strategy).remote([ref]))
            out.append({"where": where, "try": k, "bytes": rows * 384 * 4, "put_seconds": round(put_seconds, 3),
                        "fetch_seconds": round(seconds, 3), "load": round(load, 1)})
        return out
    finally:
        ray.shutdown()
        cluster.shutdown()


def scaling_line(r: dict, local: dict | None) -> str:
    """A row of the scaling table."""
    ray_, same = r.get("ray"), r.get("same_as_local", {"rows_equal": "-", "rows": "-", "max_abs_diff": float("nan")})
    load = f"{r['load_before']:.1f} -> {r['load_after']:.1f}"
    if not ray_:
        return f"| {r['run']} | {r['seconds']:.1f} | | | | 1.00 | | | | | {load} |"
    speed = f"{r['speedup']:.2f}x ({r['stack_speedup']:.2f}x)" if "speedup" in r else ""
    per_node = ", ".join(f"{b / 1e6:.1f}" for b in ray_["object_store_bytes_per_node"].values())
    return (f"| {r['run']} | {r['seconds']:.1f} | {ray_['seconds']:.1f} | {ray_['cpu_seconds']:.0f} | {speed} | "
            f"{r['seconds'] / local['seconds'] if local else float('nan'):.2f} | {ray_['overhead_seconds_median']:.3f} s, "
            f"{100 * ray_['overhead_share']:.1f}% | {sum(ray_['features_bytes'].values()) / 1e6:.1f} | {per_node} | "
            f"{same['rows_equal']}/{same['rows']} (max diff {same['max_abs_diff']:.1e}) | {load} |")


def table(scale: list[dict], unit_rows: list[dict]) -> str:
    lines = []
    if scale:
        lines += ["| run | seconds (command) | seconds (stacks) | stacks' CPU seconds | speed-up vs 1x1 before "
                  "(stacks) | time vs local | overhead per stack (median, share) | features MB | object store MB "
                  "per node | rows = local | load |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        local = scale[0] if "ray" not in scale[0] else None
        lines += [scaling_line(r, local) for r in scale]
    if unit_rows:
        lines += ["", "| unit of work (short grid, 2 nodes x 1 CPU) | stacks | overhead per stack: median | mean | "
                      "share | seconds | load |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {u['unit']} | {u['stacks']} | {u['overhead_seconds_median']:.3f} s | "
                  f"{u['overhead_seconds_mean']:.3f} s | {100 * u['overhead_share']:.1f}% | {u['seconds']:.1f} | "
                  f"{u['load_before']:.1f} |" for u in unit_rows]
    return "\n".join(lines)


def main() -> None:
    global NODE_STORE_MB
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="a store holding the dataset's texts (MiniLM for the main job)")
    parser.add_argument("--data", required=True, help="the dataset (the main job: ../shared/datasets/stsb)")
    parser.add_argument("--grid", default="examples/grid.toml")
    parser.add_argument("--units", default="task,actor", help="units of work to compare ('' skips it)")
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--clusters", default="1x1,2x1", help="the clusters run, NODESxCPUS each, in this order")
    parser.add_argument("--no-local", action="store_true", help="no local engine run (nor rows compared with it)")
    parser.add_argument("--node-store-mb", type=int, default=NODE_STORE_MB, help="each node's object store")
    parser.add_argument("--fetch-rows", type=int, default=0, help="also time the cross-node fetch of a (rows, 384) "
                        "float32 matrix alone (1002700: the 1 M-document set's features; needs --node-store-mb 2000)")
    parser.add_argument("--repeats", type=int, default=1, help="ray runs of 1x1 then 2x1, this many times over")
    parser.add_argument("--json", default=None)
    parser.add_argument("--keep", default=None, help="a folder to keep the grids in (default: a temporary one)")
    args = parser.parse_args()
    NODE_STORE_MB = args.node_store_mb
    root = Path(args.keep or tempfile.mkdtemp(prefix="bench-grid-ray-"))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    scale = [] if args.skip_scaling else scaling(args, root)
    unit_rows = units(args, root) if args.units else []
    fetches = fetch_check(args.fetch_rows) if args.fetch_rows else []
    print(table(scale, unit_rows))
    for f in fetches:
        print(f"fetch of {f['bytes'] / 1e6:.0f} MB on the {f['where']} (try {f['try']}): {f['fetch_seconds']:.3f} s "
              f"(put {f['put_seconds']:.2f} s; load {f['load']})")
    print(f"{device_name('cpu')}; {time.time() - t0:.0f} s in all; grids in {root}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": device_name("cpu"), "grid": args.grid, "data": args.data,
                                               "scaling": scale, "units": unit_rows,
                                               "fetches": fetches}, indent=2))


if __name__ == "__main__":
    main()
