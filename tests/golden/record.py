"""Record the golden outputs: `python tests/golden/record.py` runs every scenario (scenarios.run_all) in a
temporary directory and writes tests/golden/golden.json, with the CPU it ran on (`cpu`: its model name and
whether it has avx512f, whose matmul kernels round differently; test_golden.py widens its tolerance on a
CPU of the other kind). Rerun only when a change of numbers is intended."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden.json"


def cpu_info() -> dict:
    """{"model": the CPU model name, "avx512f": whether its flags list avx512f} from /proc/cpuinfo."""
    model, flags = "unknown", set()
    cpuinfo = Path("/proc/cpuinfo")
    for line in (cpuinfo.read_text() if cpuinfo.is_file() else "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return {"model": model, "avx512f": "avx512f" in flags}


def main() -> None:
    sys.path.insert(0, str(HERE.parent))  # tests/: the shared helpers import by name (as under pytest)
    from golden.scenarios import run_all

    with tempfile.TemporaryDirectory() as tmp:
        results = run_all(Path(tmp))
    GOLDEN.write_text(json.dumps({**results, "cpu": cpu_info()}, sort_keys=True, indent=1) + "\n")
    print(f"wrote {GOLDEN}: {len(results)} scenarios")


if __name__ == "__main__":
    main()
