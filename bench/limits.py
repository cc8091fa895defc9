"""What the machine can do, measured in the run that compares against it (bench/grid.py, bench/featurize.py).

A shared machine's speed drifts with its load, so a benchmark measures the matmul limit itself, in the same
process, right before and after its workload, and states each result as a share of the best it measured:

    python bench/limits.py            # prints the probe alone

`matmul_limit(precision)`: GFLOP/s of one large square matmul (2048^3 on CPU, 8192^3 on GPU; 2 FLOP per
multiply-add), the best of a few repeats, on torch's current thread count. bf16 uses the CPU's AMX tiles
(oneDNN) where the CPU has them, the tensor cores on a GPU.
"""
from __future__ import annotations

import time

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_limit(precision: str, device: str = "cpu", n: int | None = None, repeats: int = 5) -> float:
    """Best GFLOP/s of an n x n x n matmul in `precision` ("fp32" or "bf16")."""
    n = n or (8192 if device.startswith("cuda") else 2048)
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=device).to(DTYPES[precision])
    b = torch.randn(n, n, generator=g, device=device).to(DTYPES[precision])
    a @ b  # warm-up (kernel selection, AMX tile configuration)
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e9


def probe(precisions=("fp32", "bf16"), device: str = "cpu") -> dict[str, float]:
    """{precision: GFLOP/s} of the matmul probe."""
    return {p: round(matmul_limit(p, device), 1) for p in precisions}


def best_of(*probes: dict[str, float]) -> dict[str, float]:
    """The highest limit each precision reached over several probes (the machine at its least loaded)."""
    return {p: max(pr[p] for pr in probes if p in pr) for p in {k for pr in probes for k in pr}}


if __name__ == "__main__":
    print(f"torch threads {torch.get_num_threads()}: " +
          ", ".join(f"{p} {v:,.0f} GFLOP/s" for p, v in probe().items()))
