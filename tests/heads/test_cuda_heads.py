"""Heads on a GPU (`--device cuda` of train-head, eval and grid): the task's features, the stacks, mining and
ranking on the device give the CPU's figures (the same features, weights initialised on the CPU; only the order
of float sums differs). Marked `gpu`; skipped where torch sees no CUDA device. Without one, `--device cuda` is a
one-line error and `--device cpu` is what the default gives."""
from __future__ import annotations

import json
import random

import polars as pl
import pytest
import torch

from .conftest import FAST, assert_bad_input, cli
from .finetune_world import WORDS


CASES = {  # name: (dataset key, extra options)
    "ir-exact": ("beir", ("--epochs", "3", "--remine")),
    "ir-candidates": ("beir", ("--epochs", "3", "--remine", "--exact-max", "0", "--pool-k", "20")),
    "ir-remine-every-2": ("beir", ("--epochs", "3", "--remine", "--remine-every", "2")),
    "ir-anchor": ("beir", ("--epochs", "2", "--anchor-weight", "0.5")),
    "sts": ("sts05", ("--epochs", "2")),
    "pairs": ("pos", ("--epochs", "2")),
    "labelled-pairs": ("labelled", ("--epochs", "2")),
}


def _train(w, tmp, name: str, device: str, data_key: str, extra) -> tuple[dict, dict]:
    out = tmp / f"{name}-{device}"
    r = cli("train-head", "--store", w["store"], "--data", w[data_key], "--out", out, *FAST, *extra,
            "--device", device)
    assert r.exit_code == 0, r.output
    return json.loads((out / "metrics.json").read_text()), json.loads((out / "config.json").read_text())


def _close(a: dict, b: dict, tol: float) -> None:
    for k, v in a.items():
        if isinstance(v, float) and v == v:  # NaN: nothing to compare
            assert abs(v - b[k]) <= tol, (k, v, b[k])


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_train_head_on_cuda_gives_the_cpu_figures(data_world, tmp_path, name):
    data_key, extra = CASES[name]
    cpu, cpu_cfg = _train(data_world, tmp_path, name, "cpu", data_key, extra)
    gpu_m, gpu_cfg = _train(data_world, tmp_path, name, "cuda", data_key, extra)
    assert cpu_cfg["device"] == "cpu" and gpu_cfg["device"] == "cuda"
    _close(cpu["baseline"], gpu_m["baseline"], 1e-4)  # the frozen features, ranked on the GPU
    _close(cpu["head"], gpu_m["head"], 0.05)  # trained there: float sums in another order
    assert cpu.get("negatives", {}).get("method") == gpu_m.get("negatives", {}).get("method")
    assert [h["epoch"] for h in cpu["history"]] == [h["epoch"] for h in gpu_m["history"]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_eval_of_one_head_on_cuda_equals_the_cpu_eval(data_world, tmp_path):
    got = {}
    for device in ("cpu", "cuda"):
        r = cli("eval", "--store", data_world["store"], "--head", data_world["head"], "--data", data_world["pos"],
                "--out", tmp_path / device, "--device", device)
        assert r.exit_code == 0, r.output
        got[device] = json.loads((tmp_path / device / "metrics.json").read_text())
    assert got["cuda"]["device"] == "cuda"
    _close(got["cpu"]["head"], got["cuda"]["head"], 1e-3)  # the same weights: only the last bits may differ
    _close(got["cpu"]["baseline"], got["cuda"]["baseline"], 1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_grid_on_cuda_gives_the_cpu_figures(data_world, tmp_path):
    spec = tmp_path / "grid.toml"
    spec.write_text('[grid]\nlr = [1e-3, 3e-2]\nseed = [0, 1]\n'
                    '[fixed]\nepochs = 2\nbatch_size = 8\nhidden = 16\nmined_k = 2\nexact_max = 0\npool_k = 20\n')
    frames = {}
    for device in ("cpu", "cuda"):
        r = cli("grid", "--store", data_world["store"], "--data", data_world["beir"], "--grid", spec,
                "--out", tmp_path / device, "--device", device, "--ensemble", "2", "--soup", "2")
        assert r.exit_code == 0, r.output
        frames[device] = pl.read_parquet(tmp_path / device / "results.parquet").sort("head_id")
    a, b = frames["cpu"], frames["cuda"]
    assert a["head_id"].to_list() == b["head_id"].to_list() and (b["status"] == "ok").all()
    for col in ("dev_primary", "test_primary"):
        pairs = [(x, y) for x, y in zip(a[col].to_list(), b[col].to_list()) if x is not None]
        assert pairs and all(abs(x - y) <= 0.05 for x, y in pairs), (col, pairs)


@pytest.fixture(scope="module")
def labels_world(tmp_path_factory):
    """Labelled texts (four classes in two groups) featurized by a tiny random BERT."""
    from .finetune_world import tiny_bert

    root = tmp_path_factory.mktemp("cuda-labels")
    rng = random.Random(0)
    groups = [WORDS[i::4] for i in range(4)]
    rows = [{"text": " ".join(rng.choice(groups[c]) for _ in range(5)) + f" {c}{i}", "label": f"top{c // 2}.sub{c}",
             "split": "train" if i < 10 else "test"} for c in range(4) for i in range(15)]
    pl.DataFrame(rows).write_parquet(root / "news.parquet")
    store = root / "store"
    r = cli("featurize", "--model", tiny_bert(root / "model", layers=2), "--data", root / "news.parquet",
            "--store", store, "--dtype", "float32")
    assert r.exit_code == 0, r.output
    return root, store


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_labelled_texts_on_cuda_give_the_cpu_figures(labels_world):
    root, store = labels_world
    got = {}
    for device in ("cpu", "cuda"):
        out = root / f"head-{device}"
        r = cli("train-head", "--store", store, "--data", root / "news.parquet", "--label-sep", ".", "--hierarchy",
                "--loss", "supcon-kl", "--epochs", "2", "--batch-size", "8", "--hidden", "16", "--out", out,
                "--device", device)
        assert r.exit_code == 0, r.output
        got[device] = json.loads((out / "metrics.json").read_text())
    _close(got["cpu"]["baseline"], got["cuda"]["baseline"], 1e-4)
    _close(got["cpu"]["head"], got["cuda"]["head"], 0.1)  # 20 test texts: one text is 0.05 of accuracy


def test_cuda_without_a_gpu_is_one_line_and_cpu_is_the_default_here(data_world, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = cli("train-head", "--store", data_world["store"], "--data", data_world["pos"], "--out", tmp_path / "x",
            *FAST, "--device", "cuda")
    assert_bad_input(r, "cuda")
    r = cli("eval", "--store", data_world["store"], "--head", data_world["head"], "--data", data_world["pos"],
            "--out", tmp_path / "e", "--device", "cuda")
    assert_bad_input(r, "cuda")
    r = cli("train-head", "--store", data_world["store"], "--data", data_world["pos"], "--out", tmp_path / "auto", *FAST)
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "auto" / "config.json").read_text())["device"] == "cpu"
    r = cli("train-head", "--store", data_world["store"], "--data", data_world["pos"], "--out", tmp_path / "cpu", *FAST,
            "--device", "cpu")
    assert r.exit_code == 0, r.output
    auto, cpu = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("auto", "cpu"))
    assert auto["head"] == cpu["head"] and auto["baseline"] == cpu["baseline"]
