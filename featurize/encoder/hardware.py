"""Does this CPU do bf16 arithmetic natively, or would `--precision bf16` emulate it (a performance trap)?

x86 CPUs multiply bf16 in hardware only with AVX-512-BF16 (Cooper Lake, Zen 4 and later) or AMX (Sapphire
Rapids and later); elsewhere torch converts every bf16 matmul through fp32 in scalar code: on an AMD EPYC
with AVX2 only a 2048^2 bf16 matmul ran at 0.3 GFLOP/s against 97 in fp32, and `cli featurize --precision
bf16` at 1/6 of fp32's tokens/s. The answer comes from the CPU's flags (/proc/cpuinfo: `avx512_bf16`,
`amx_bf16`; `bf16` on Arm) where they say it; where they do not (no AVX-512 is clear: emulated; AVX-512
without its bf16 extension, another architecture, no /proc/cpuinfo) a short fp32 and bf16 matmul
decide (a few tenths of a second). Whenever bf16 is not native the same matmuls give the slowdown the
warning quotes. The result is cached per machine: one small JSON under the user's cache directory
($XDG_CACHE_HOME or ~/.cache, then headstore/), named by a hash of the CPU model, its flags and the torch
version, so a new CPU or a new torch measures again.

torch is imported inside the functions: `import headstore.cli` stays torch-free.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

from headstore.data.files import atomic_write_json

NATIVE_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")  # x86 AMX / AVX-512-BF16 tiles and FMAs; Arm's BF16 (aarch64)
# the flags a benchmark records beside its figures: what decides bf16, fp16 and fp32 matmul speed
REPORTED_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
                  "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "asimd", "sve", "bf16")
# measured bf16 at least this share of fp32's speed: not a trap. Native bf16 runs at 1-6x fp32 (AMX:
# ~3x in bench/speed/limits.py on the README's Xeon); emulated it ran at 1/70-1/300 here.
NATIVE_MIN_SHARE = 0.5
PROBE_N = 256  # the probe's square matmul: 34 MFLOP, ~0.03-0.1 s in emulated bf16, well under a ms in fp32
# where bf16 is native, the matmul whose bf16/fp32 speed an fp32 featurize run quotes (bf16_note): 2 GFLOP, big
# enough for oneDNN's bf16 kernels to show their rate (at 256^3 the call overhead hides it), ~0.1 s in all
SPEED_N = 1024
CACHE_VERSION = 2  # 2: bf16_speedup measured where bf16 is native


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 `flags`, Arm `Features`); empty where unreadable."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo `model name`, else platform.processor(), else the architecture)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model") and value.strip():
                return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_info() -> dict:
    """The CPU as a benchmark records it: model, the speed-relevant flags it has, torch's CPU capability."""
    import torch

    flags = cpu_flags()
    return {"model": cpu_model(), "flags": sorted(f for f in REPORTED_FLAGS if f in flags),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}


def flags_verdict(flags: set[str], machine: str | None = None) -> bool | None:
    """True: native bf16 per the flags; False: surely emulated (x86 without AVX-512); None: unclear."""
    machine = (machine or platform.machine()).lower()
    if flags & set(NATIVE_FLAGS):
        return True
    if machine in ("x86_64", "amd64", "i686", "x86") and "avx2" in flags and "avx512f" not in flags:
        return False  # AVX2 only: oneDNN has no bf16 kernel for it
    return None  # AVX-512 without its bf16 extension (oneDNN may convert fast), Arm without BF16, no flags


def measure_matmuls(n: int = PROBE_N, repeats: int = 3) -> dict:
    """Best GFLOP/s of an n^3 matmul in fp32 and in bf16 on torch's current threads (a few tenths of a s)."""
    import torch

    rates = {}
    g = torch.Generator().manual_seed(0)
    a0, b0 = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    with torch.inference_mode():
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            a, b = a0.to(dtype), b0.to(dtype)
            a @ b  # warm-up: kernel choice, AMX tile configuration
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                a @ b
                best = min(best, time.perf_counter() - t0)
                if best > 0.15:  # emulated: one slow run is measurement enough
                    break
            rates[name] = 2 * n ** 3 / max(best, 1e-9) / 1e9
    return {"fp32_gflops": round(rates["fp32"], 2), "bf16_gflops": round(rates["bf16"], 2),
            "slowdown": round(rates["fp32"] / max(rates["bf16"], 1e-9), 1)}


def cache_dir() -> Path:
    """Where per-machine results live: $XDG_CACHE_HOME/headstore, else ~/.cache/headstore."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "headstore"


def _cache_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"bf16-{digest}.json"


@functools.lru_cache(maxsize=None)
def bf16_support() -> dict:
    """Whether this CPU runs bf16 natively, and how that was found: {"native": bool, "source": "cpu flags"
    or "measured", "slowdown": fp32 GFLOP/s / bf16 GFLOP/s of the probe (measured where bf16 is not
    native by the flags, else None), "cpu": cpu_info()}. Read from the per-machine cache where present
    (once per process), else decided and cached."""
    import torch

    flags = cpu_flags()
    cpu = cpu_info()
    key = {"version": CACHE_VERSION, "model": cpu["model"], "torch": torch.__version__,
           "flags_sha256": hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16]}
    path = _cache_path(key)
    try:
        cached = json.loads(path.read_text())
        if cached.get("key") == key and isinstance(cached.get("native"), bool):
            return cached
    except (OSError, ValueError):
        pass  # absent or damaged: decide again
    verdict = flags_verdict(flags)
    result = {"key": key, "cpu": cpu, "native": verdict, "source": "cpu flags", "slowdown": None}
    if verdict is not True:  # unclear: the matmuls decide; emulated: they give the warning its figure
        result.update(measure_matmuls())
        if verdict is None:
            result.update(native=result["bf16_gflops"] >= NATIVE_MIN_SHARE * result["fp32_gflops"],
                          source="measured")
    if result["native"]:  # how much faster bf16 would be here (bf16_note)
        speed = measure_matmuls(SPEED_N)
        result["bf16_speedup"] = round(speed["bf16_gflops"] / max(speed["fp32_gflops"], 1e-9), 2)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, result, sort_keys=True)  # a .incomplete name, then renamed
    except OSError:
        pass  # a read-only home: decide again next process
    return result


def bf16_note(precision: str, device: str = "cpu") -> str | None:
    """For an fp32 run on a CPU with native bf16: how much faster `--precision bf16` would be, from this machine's
    measured matmuls (bf16_support's SPEED_N^3 probe); None elsewhere. bf16 stays opt-in: ~1e-2 feature error."""
    if precision != "fp32" or not str(device).startswith("cpu"):
        return None
    info = bf16_support()
    if not info["native"] or not info.get("bf16_speedup"):
        return None
    return (f"this CPU does bf16 natively: its bf16 matmuls ran {info['bf16_speedup']:g}x fp32's here (a {SPEED_N}^3 "
            "probe, featurize.encoder.hardware); --precision bf16 would encode up to that much faster (attention, "
            "pooling and tokenising gain less), at ~1e-2 instead of ~1e-6 feature error, into a store of its own fingerprint")


def native_bf16() -> bool:
    """Does this CPU do bf16 matmuls natively (AMX, AVX-512-BF16, Arm BF16, or measured as fast)?"""
    return bool(bf16_support()["native"])


_warned: list[str] = []  # the one warning this process printed (a list: tests reset it)


def emulated_bf16_warning(fix: str = "--precision fp32") -> str:
    """The one line `warn_if_emulated_bf16` prints."""
    info = bf16_support()
    cpu = info["cpu"]
    flags = ", ".join(cpu["flags"]) or "no flags read"
    slow = info.get("slowdown")
    figure = (f"a {PROBE_N}^3 bf16 matmul ran {slow:,.0f}x slower than fp32 here (larger ones worse)" if slow
              else "bf16 matmuls are emulated in fp32 here")
    return (f"Warning: bf16 on a CPU without native bf16 ({cpu['model']}; {flags}; no avx512_bf16/amx_bf16): "
            f"{figure}; use {fix} (docs/speed.md)")


def warn_if_emulated_bf16(precision: str, device: str = "cpu", fix: str = "--precision fp32") -> str | None:
    """Print one line on stderr, once per process, when `precision` is bf16 on a CPU without native bf16;
    returns the line printed (None otherwise). `fix` names the setting to change where the user set it."""
    if precision != "bf16" or not str(device).startswith("cpu") or _warned or native_bf16():
        return None
    line = emulated_bf16_warning(fix)
    _warned.append(line)
    print(line, file=sys.stderr, flush=True)
    return line
