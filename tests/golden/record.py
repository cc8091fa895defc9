"""Record the golden outputs: `python tests/golden/record.py` runs every scenario (scenarios.run_all) in a
temporary directory and writes the golden file of this CPU's kind, with the CPU it ran on (`cpu`: its model
name and whether it has avx512f, whose matmul kernels round differently, so a tiny head trained on one kind can
rank a tied document otherwise): tests/golden/golden.json on a CPU without avx512f, golden-avx512f.json on one
with it (test_golden.py compares with the file of its own kind, or widens its tolerance where only the other
exists). Rerun only when a change of numbers is intended, on both kinds of CPU. A CPU with avx512f records the
other kind too, held to AVX2 by the environment of AVX2_EMULATION:

    env ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell \
        python tests/golden/record.py

(checked 2026-11-29 on an AMD EPYC Zen 4: the code of f5ab39d so held reproduced golden.json, recorded on a real
AVX2-only AMD EPYC, to 1.2e-7 on every scenario that file then held up to date)."""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden.json"  # recorded on a CPU without avx512f (AMD EPYC, AVX2)
GOLDEN_AVX512F = HERE / "golden-avx512f.json"  # recorded on a CPU with avx512f (AMD EPYC, Zen 5)


def golden_path(avx512f: bool) -> Path:
    """The golden file of a CPU kind."""
    return GOLDEN_AVX512F if avx512f else GOLDEN


# the environment that holds torch's kernels, MKL, oneDNN and OpenBLAS to AVX2 on a CPU with avx512f
AVX2_EMULATION = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                  "OPENBLAS_CORETYPE": "Haswell"}


def avx2_emulated() -> bool:
    """Whether this process runs under every setting of AVX2_EMULATION."""
    return all(os.environ.get(key) == value for key, value in AVX2_EMULATION.items())


def cpu_info() -> dict:
    """{"model": the CPU model name, "avx512f": whether its kernels use avx512f (its flags list it and
    AVX2_EMULATION is not in force), "avx2_emulated"} from /proc/cpuinfo and the environment."""
    model, flags = "unknown", set()
    cpuinfo = Path("/proc/cpuinfo")
    for line in (cpuinfo.read_text() if cpuinfo.is_file() else "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    emulated = "avx512f" in flags and avx2_emulated()
    return {"model": model, "avx512f": "avx512f" in flags and not emulated, "avx2_emulated": emulated}


def main(argv: list[str] | None = None) -> None:
    """`record.py`: every scenario into this CPU kind's file. `record.py --only A B`: only scenarios A and B (their
    numbers changed on purpose), kept in this kind's file beside the others and dropped from the other kind's file,
    whose tests then compare them with this recording at its wider tolerance until that kind records them too."""
    sys.path.insert(0, str(HERE.parent))  # tests/: the shared helpers import by name (as under pytest)
    from golden.scenarios import run_all

    argv = sys.argv[1:] if argv is None else argv
    only = argv[argv.index("--only") + 1:] if "--only" in argv else None
    with tempfile.TemporaryDirectory() as tmp:
        results = run_all(Path(tmp))
    cpu = cpu_info()
    path, other = golden_path(cpu["avx512f"]), golden_path(not cpu["avx512f"])
    if only is not None:
        unknown = sorted(set(only) - set(results))
        if unknown:
            raise SystemExit(f"--only: no scenario {unknown}; the scenarios: {sorted(results)}")
        kept = json.loads(path.read_text()) if path.exists() else {}
        results = {**{k: v for k, v in kept.items() if k != "cpu"}, **{k: results[k] for k in only}}
        if other.exists():
            theirs = json.loads(other.read_text())
            other.write_text(json.dumps({k: v for k, v in theirs.items() if k not in only}, sort_keys=True,
                                        indent=1) + "\n")
    path.write_text(json.dumps({**results, "cpu": cpu}, sort_keys=True, indent=1) + "\n")
    print(f"wrote {path}: {len(results)} scenarios")


if __name__ == "__main__":
    main()
