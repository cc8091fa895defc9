"""What the machine can do, measured in the run that compares against it (bench/speed/grid.py, bench/speed/featurize.py).

A shared machine's speed drifts with its load, so a benchmark measures the matmul limit itself, in the same
process, right before and after its workload, and states each result as a share of the best it measured:

    python bench/speed/limits.py            # prints the probe alone

`memory_limit()`: GB/s of one 256 MB copy (read + written), the best of a few: the bound on what streams from
memory. `matmul_limit(precision)`: GFLOP/s of one large square matmul (2048^3 on CPU, 8192^3 on GPU; 2 FLOP per
multiply-add), the best of a few repeats, on torch's current thread count. bf16 uses the CPU's AMX tiles
(oneDNN) where the CPU has them, the tensor cores on a GPU. A CPU without AMX or AVX-512-BF16 emulates bf16
in fp32 (an AMD EPYC with AVX2 only: 0.3 GFLOP/s against 97 in fp32), so every figure is recorded with the
machine it was measured on: `machine()` (the CPU model, its bf16/AVX-512/AMX flags, whether bf16 is native,
the GPU if any) goes into each benchmark's JSON (top level and every row) and `machine_line()` above each
table.

    python bench/speed/limits.py --json runs/limits.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from headstore.featurize.encoder.hardware import cpu_info, native_bf16

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_limit(precision: str, device: str = "cpu", n: int | None = None, repeats: int = 5) -> float:
    """Best GFLOP/s of an n x n x n matmul in `precision` ("fp32" or "bf16"). Emulated bf16 (a CPU without
    AMX / AVX-512-BF16) is probed at 1024^3, where one 2048^3 call would take about a minute; a repeat
    slower than 2 s ends the repeats."""
    on_gpu = device.startswith("cuda")
    n = n or (8192 if on_gpu else 1024 if precision == "bf16" and not native_bf16() else 2048)
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
        if best > 2.0:
            break
    return 2 * n ** 3 / best / 1e9


def memory_limit(device: str = "cpu", mb: int = 256, repeats: int = 5) -> float:
    """Best GB/s of copying an `mb` MB fp32 tensor into another (bytes read + written): the DRAM bandwidth a
    step's streaming (an optimiser over parameters far larger than the caches) can reach at most."""
    a = torch.ones(mb * 2 ** 20 // 4, device=device)
    b = torch.empty_like(a)
    b.copy_(a)  # warm-up (pages touched)
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        b.copy_(a)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.numel() * 4 / best / 1e9


def probe(precisions=("fp32", "bf16"), device: str = "cpu") -> dict[str, float]:
    """{precision: GFLOP/s} of the matmul probe."""
    return {p: round(matmul_limit(p, device), 1) for p in precisions}


def best_of(*probes: dict[str, float]) -> dict[str, float]:
    """The highest limit each precision reached over several probes (the machine at its least loaded)."""
    return {p: max(pr[p] for pr in probes if p in pr) for p in {k for pr in probes for k in pr}}


def machine(device: str = "cpu") -> dict:
    """What the figures hold for: the CPU model and its bf16-relevant flags (AVX-512, AVX-512-BF16, AMX),
    whether bf16 is native here (featurize.encoder.hardware), torch's CPU capability and threads, the GPU if used."""
    cpu = cpu_info()
    m = {"cpu": cpu["model"], "cpu_flags": cpu["flags"], "bf16_native_on_cpu": native_bf16(),
         "torch_cpu_capability": cpu["torch_cpu_capability"], "torch": cpu["torch"],
         "torch_threads": torch.get_num_threads()}
    if device.startswith("cuda"):
        m["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return m


def machine_line(m: dict) -> str:
    """One line naming the machine, printed above each benchmark table."""
    flags = ", ".join(m["cpu_flags"]) or "flags unknown"
    gpu = f"; GPU {m['gpu']}" if "gpu" in m else ""
    bf16 = "native" if m["bf16_native_on_cpu"] else "emulated (no AMX / AVX-512-BF16: far slower than fp32)"
    return f"CPU {m['cpu']} ({flags}); CPU bf16 {bf16}; torch {m['torch']}, {m['torch_threads']} threads{gpu}"


def with_machine(rows: list[dict], m: dict) -> list[dict]:
    """Each row with the CPU (model and flags) it was measured on, for the JSON."""
    return [{**r, "cpu": m["cpu"], "cpu_flags": m["cpu_flags"], **({"gpu": m["gpu"]} if "gpu" in m else {})}
            for r in rows]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="The matmul probe alone, with the machine it ran on.")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    m = machine(args.device)
    rows = with_machine([{"precision": p, "gflop_per_s": v} for p, v in probe(device=args.device).items()], m)
    print(machine_line(m))
    print("\n| precision | matmul GFLOP/s | CPU | CPU flags |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['precision']} | {r['gflop_per_s']:,.1f} | {r['cpu']} | {', '.join(r['cpu_flags'])} |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"machine": m, "rows": rows}, indent=2))
