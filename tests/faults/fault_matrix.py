"""The fault suite's matrix: every injected case as (command, site, fault, seed), one place.

The tests parametrize from it (their ids show site, fault and seed) and the suite prints its size at the end
of a run (conftest.py): distinct commands × sites × faults × seeds, and the cases drawn from that product.
A seed picks the call of the site that fails among the calls an uninterrupted run makes
(fault_world.seeded_nth); `None` is a fixed call, named in the test (the last shard write, the first
manifest rename, ...).
"""
from __future__ import annotations

WRITE = (  # write errors, in this process (tests/faults/test_fault_writes.py)
    ("featurize", "zarr", "ENOSPC", 0), ("featurize", "zarr", "ENOENT", 1),
    ("featurize", "parquet", "EDQUOT", 0), ("featurize", "parquet", "ENOSPC", 1),
    ("featurize", "atomic", "EIO", 0), ("featurize", "atomic", "EROFS", 1),
    ("featurize", "fsync", "EIO", 0), ("featurize", "fsync", "EIO", 1),
    ("train-head", "atomic", "ENOSPC", 0), ("train-head", "atomic", "EDQUOT", 1), ("train-head", "fsync", "EIO", 0),
    ("grid", "parquet", "ENOSPC", 0), ("grid", "atomic", "EDQUOT", 1),
    ("index", "atomic", "ENOSPC", 0), ("index", "parquet", "EIO", 0),
    ("export", "atomic", "ENOSPC", 1),
    ("store compact", "parquet", "ENOSPC", None), ("store compact", "atomic", "EIO", None),
    ("store migrate", "zarr", "ENOSPC", 0), ("store migrate", "parquet", "EDQUOT", 0),
    ("store migrate", "atomic", "EIO", 0),
)
SIGNAL = (  # real signals to a child process (tests/faults/test_fault_signals.py)
    ("featurize", "zarr", "SIGKILL", 0), ("featurize", "zarr", "SIGKILL", 1),
    ("featurize", "zarr", "SIGINT", 2), ("featurize", "zarr", "SIGINT", 3),
    ("grid", "atomic", "SIGKILL", 0), ("grid", "atomic", "SIGINT", 1),
    ("train-head", "atomic", "SIGINT", 2),
    ("store compact", "atomic", "SIGKILL", None), ("store migrate", "zarr", "SIGKILL", None),
)
PROCESSES = (  # a fault in a child while this process waits or reads (tests/faults/test_fault_processes.py)
    ("featurize", "zarr", "ENOSPC", None),  # the last shard write: the old hang
    ("featurize", "zarr", "SIGKILL", None),  # an append killed while this process reads the store
)
RAY = (  # the Ray engine, in this process (tests/faults/test_fault_ray.py)
    ("featurize --engine ray", "parquet", "ENOSPC", None),  # the driver's second commit
    ("featurize --engine ray", "actor", "SIGKILL", None),  # every actor that reaches the segment
    ("grid --engine ray", "parquet", "ENOSPC", None),  # the driver's first results.parquet, a stack in flight
)
MATRIX = WRITE + SIGNAL + PROCESSES + RAY


def cases(table: tuple, command: str) -> list[tuple]:
    """(site, fault, seed) of `command`'s cases in `table` (a test's parameters)."""
    return [(site, fault, seed) for cmd, site, fault, seed in table if cmd == command]


def size() -> str:
    """The matrix's size, as the issue asks it: sites × faults × seeds, and the cases run."""
    commands, sites, faults = ({case[i] for case in MATRIX} for i in range(3))
    seeds = {case[3] for case in MATRIX if case[3] is not None}
    assert len(set(MATRIX)) == len(MATRIX), "a case listed twice"
    return (f"fault matrix: {len(MATRIX)} injected cases ({len(WRITE)} write errors, {len(SIGNAL)} signals, "
            f"{len(PROCESSES)} across processes, {len(RAY)} Ray) drawn from {len(commands)} commands × "
            f"{len(sites)} sites ({', '.join(sorted(sites))}) × {len(faults)} faults ({', '.join(sorted(faults))}) "
            f"× {len(seeds)} seeds")
