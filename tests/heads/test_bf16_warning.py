"""An explicit bf16 on a CPU without native bf16 (emulated: 5-300x slower than fp32) warns once, one line
on stderr, with the slowdown and what to do, for featurize, train-head and grid (docs/bad-input.md)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from headstore.cli import main
from headstore.featurize.encoder import hardware

EMULATED = {"native": False, "source": "cpu flags", "slowdown": 81.0, "fp32_gflops": 103.6, "bf16_gflops": 1.28,
            "cpu": {"model": "AMD EPYC", "flags": ["avx2", "fma"], "torch_cpu_capability": "AVX2"}}


@pytest.fixture
def emulated(monkeypatch):
    """The detection says: this CPU has no native bf16 (and nothing has warned yet in this process)."""
    monkeypatch.setattr(hardware, "bf16_support", lambda: EMULATED)
    monkeypatch.setattr(hardware, "_warned", [])


def warning_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if "without native bf16" in line]


def test_featurize_with_bf16_warns_once(world, emulated, tmp_path):
    r = CliRunner().invoke(main, ["featurize", "--model", str(world.model), "--data", str(world.beir),
                                  "--store", str(tmp_path / "s"), "--precision", "bf16"])
    assert r.exit_code == 0, r.output
    assert warning_lines(r) == [
        "Warning: bf16 on a CPU without native bf16 (AMD EPYC; avx2, fma; no avx512_bf16/amx_bf16): a 256^3 "
        "bf16 matmul ran 81x slower than fp32 here (larger ones worse); use --precision fp32 (docs/speed.md)"]
    assert "Traceback" not in r.output


def test_featurize_auto_and_fp32_do_not_warn(world, emulated, tmp_path):
    for precision in ("auto", "fp32"):
        r = CliRunner().invoke(main, ["featurize", "--model", str(world.model), "--data", str(world.beir),
                                      "--store", str(tmp_path / "s"), "--precision", precision])
        assert r.exit_code == 0, r.output
        assert warning_lines(r) == []


def test_train_head_with_bf16_warns(world, emulated, tmp_path):
    args = ["train-head", "--store", str(world.store), "--data", str(world.beir), "--epochs", "1",
            "--hidden", "16", "--batch-size", "8"]
    r = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "fp32")])
    assert r.exit_code == 0, r.output
    assert warning_lines(r) == []  # the default fp32 never warns
    r = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "bf16"), "--precision", "bf16"])
    assert r.exit_code == 0, r.output
    (line,) = warning_lines(r)
    assert "81x slower than fp32" in line and line.endswith("use --precision fp32 (docs/speed.md)")


def test_grid_with_bf16_warns_naming_the_grid_setting(world, emulated, tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nprecision = ["fp32", "bf16"]\n[fixed]\nepochs = 1\nbatch_size = 8\nhidden = 16\n')
    r = CliRunner().invoke(main, ["grid", "--store", str(world.store), "--data", str(world.beir),
                                  "--grid", str(grid), "--out", str(tmp_path / "g")])
    assert r.exit_code == 0, r.output
    (line,) = warning_lines(r)
    assert "81x slower than fp32" in line and f'use precision = "fp32" in {grid}' in line
