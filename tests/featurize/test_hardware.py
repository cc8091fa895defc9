"""featurize.encoder.hardware: whether this CPU does bf16 natively, decided from its flags or measured once, and
cached per machine (a JSON under the user's cache directory)."""
from __future__ import annotations

import json

import pytest

from headstore.featurize.encoder import hardware


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache directory and no answer remembered in this process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    hardware.bf16_support.cache_clear()
    yield tmp_path / "headstore"
    hardware.bf16_support.cache_clear()


def test_the_detector_returns_a_bool_and_a_second_call_reads_the_cache(fresh_cache, monkeypatch):
    calls = []
    real_measure = hardware.measure_matmuls
    monkeypatch.setattr(hardware, "measure_matmuls", lambda n=64, repeats=3: calls.append(n) or real_measure(n=64))
    first = hardware.native_bf16()
    assert isinstance(first, bool)
    files = list(fresh_cache.glob("bf16-*.json"))
    assert len(files) == 1 and not list(fresh_cache.glob("*.incomplete"))
    saved = json.loads(files[0].read_text())
    assert saved["native"] is first and saved["key"]["model"] == hardware.cpu_model()
    assert (saved["slowdown"] is None) == (saved["source"] == "cpu flags" and first)  # measured unless native by flags

    hardware.bf16_support.cache_clear()  # a new process: nothing in memory, only the file

    def no_more(*a, **k):
        raise AssertionError("decided again although the cache holds the answer")
    monkeypatch.setattr(hardware, "measure_matmuls", no_more)
    monkeypatch.setattr(hardware, "flags_verdict", no_more)
    assert hardware.native_bf16() is first
    assert hardware.bf16_support() == saved
    # the probe where the flags do not say native (its slowdown saved), then bf16's speed where native
    assert calls == ([64] if saved["slowdown"] is not None else []) + ([hardware.SPEED_N] if first else [])
    assert (saved.get("bf16_speedup", 0) > 0) is first  # where native, how much faster bf16 ran (bf16_note)


def test_another_cpu_or_torch_is_measured_again(fresh_cache, monkeypatch):
    monkeypatch.setattr(hardware, "measure_matmuls", lambda n=0: {"fp32_gflops": 100.0, "bf16_gflops": 1.0,
                                                              "slowdown": 100.0})
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.setattr(hardware, "flags_verdict", lambda flags: None)  # unclear: the matmuls decide
    assert hardware.native_bf16() is False and hardware.bf16_support()["source"] == "measured"
    hardware.bf16_support.cache_clear()
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx2", "fma", "avx512f"})
    monkeypatch.setattr(hardware, "measure_matmuls", lambda n=0: {"fp32_gflops": 100.0, "bf16_gflops": 90.0,
                                                              "slowdown": 1.1})
    assert hardware.native_bf16() is True
    assert len(list(fresh_cache.glob("bf16-*.json"))) == 2


@pytest.mark.parametrize("flags, machine, verdict", [
    ({"avx2", "avx512f", "amx_tile", "amx_bf16"}, "x86_64", True),  # Sapphire Rapids
    ({"avx2", "avx512f", "avx512_bf16"}, "x86_64", True),  # Cooper Lake, Zen 4
    ({"avx2", "fma"}, "x86_64", False),  # AVX2 only: emulated
    ({"avx2", "avx512f"}, "x86_64", None),  # AVX-512 without bf16: measured
    ({"asimd", "bf16"}, "aarch64", True),  # Arm with BF16
    ({"asimd"}, "aarch64", None),
    (set(), "x86_64", None),  # no /proc/cpuinfo
])
def test_flags_decide_where_they_can(flags, machine, verdict):
    assert hardware.flags_verdict(flags, machine) is verdict


def test_no_warning_for_fp32_gpu_or_native_bf16(monkeypatch, capsys):
    monkeypatch.setattr(hardware, "_warned", [])
    monkeypatch.setattr(hardware, "bf16_support", lambda: {"native": True})
    assert hardware.warn_if_emulated_bf16("bf16", "cpu") is None
    monkeypatch.setattr(hardware, "bf16_support", lambda: {"native": False, "slowdown": 80.0,
                                                           "cpu": {"model": "X", "flags": ["avx2"]}})
    assert hardware.warn_if_emulated_bf16("fp32", "cpu") is None
    assert hardware.warn_if_emulated_bf16("bf16", "cuda") is None
    assert capsys.readouterr().err == ""
    line = hardware.warn_if_emulated_bf16("bf16", "cpu")
    assert hardware.warn_if_emulated_bf16("bf16", "cpu") is None  # once per process
    assert capsys.readouterr().err == line + "\n"
    assert "80x slower than fp32" in line and "--precision fp32" in line


def test_importing_the_module_loads_no_torch():
    import subprocess
    import sys
    code = "import sys, headstore.featurize.encoder.hardware; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
