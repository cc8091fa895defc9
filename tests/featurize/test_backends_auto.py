"""`--backend auto` (the default) and runtimes as provenance: auto picks a runtime proven exact for the model
(its export's parity check against torch, cached with the export) and says so in the summary; a store made with
one backend takes texts from another (segments record which; the fingerprint is torch's), its features within
1e-5 of a torch store's; fp32 stores made while the backend was a fingerprint part are accepted as they are;
bf16 keeps the runtime in the fingerprint; a runtime that fails its parity check is refused, and auto skips it."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from featurize_helpers import random_texts
from test_backends import _load, fingerprint_parts, needs

from headstore.cli import main
from headstore.data.text_id import text_ids
from headstore.featurize.encoder import backends, hardware
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.encoder.exported import MANIFEST, cached_export, export_folder
from headstore.featurize.store.maintain import compact_store
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.layout import fingerprint_of
from headstore.featurize.store.verify import verify_store

TEXTS = random_texts(30, seed=11, max_words=40)  # varied lengths, several cut at the tiny model's 24 tokens
FIRST, SECOND = TEXTS[:18], TEXTS[18:]


def run(model, store, texts, cache, **kw):
    config = FeaturizeConfig(model=str(model), dtype="float32", export_cache=str(cache), batch_tokens=128,
                             device="cpu", **kw)
    return featurize_texts(config, texts, store)


def features(store_path, texts=TEXTS) -> np.ndarray:
    store = FeatureStore.open(store_path)
    return store.features(store.rows_for(text_ids(texts)))


@pytest.fixture(scope="module")
def torch_store(tiny_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("torch") / "s"
    run(tiny_model, path, TEXTS, tmp_path_factory.mktemp("unused"), backend="torch")
    return path


def test_auto_uses_a_cached_proven_export_and_equals_torch(tiny_model, torch_store, tmp_path):
    needs("openvino")
    cache = tmp_path / "cache"
    small = run(tiny_model, tmp_path / "before", TEXTS, cache)  # nothing exported yet, far too few characters
    assert small["backend"] == "torch" and "would not repay its export" in small["backend_choice"]
    assert not list(cache.glob("*openvino*"))
    cached_export(_load(FeaturizeConfig(model=tiny_model, backend="torch"), "cpu"), "openvino", (-1,), cache)
    summary = run(tiny_model, tmp_path / "auto", TEXTS, cache)
    assert summary["backend"] == "openvino" and summary["backend_choice"].startswith("auto: openvino")
    assert summary["rows_by_backend"] == {"openvino": len(TEXTS)}
    assert summary["fingerprint"] == FeatureStore.open(torch_store).fingerprint  # the backend is no part of it
    assert np.abs(features(tmp_path / "auto") - features(torch_store)).max() <= 1e-5
    folder, _ = export_folder(_load(FeaturizeConfig(model=tiny_model, backend="torch"), "cpu"), "openvino", (-1,),
                              cache)
    parity = json.loads((folder / MANIFEST).read_text())["parity"]  # checked once, kept with the export
    assert parity["exact"] and 0 <= parity["max_abs_diff"] <= 1e-5 and parity["probe_tokens"] > 24


def test_auto_builds_the_export_when_the_run_repays_it(tiny_model, torch_store, tmp_path, monkeypatch):
    needs("openvino")
    monkeypatch.setattr(backends, "AUTO_MIN_CHARS", sum(map(len, TEXTS)))
    summary = run(tiny_model, tmp_path / "auto", TEXTS, tmp_path / "cache")
    assert summary["backend"] == "openvino"
    assert np.abs(features(tmp_path / "auto") - features(torch_store)).max() <= 1e-5


def test_auto_keeps_torch_in_bf16_on_a_gpu_and_with_packing(tiny_model):
    encoder = _load(FeaturizeConfig(model=tiny_model, backend="torch"), "cpu")
    for precision, packing, why in (("bf16", False, "proven exact in fp32 only"), ("fp32", True, "packed")):
        choice = backends.choose_backend(encoder, (-1,), precision, packing, n_chars=10 ** 9)
        assert choice.backend == "torch" and why in choice.why
    assert backends.auto_candidates("cuda", "fp32", False) == ((), "torch on cuda (the runtimes run on a CPU)")


def test_a_store_takes_texts_from_another_backend_both_ways(tiny_model, torch_store, tmp_path):
    """As a user would: `cli featurize --backend openvino` then more texts with `--backend torch`, and the reverse."""
    needs("openvino")
    for name, order in (("ov-then-torch", ("openvino", "torch")), ("torch-then-ov", ("torch", "openvino"))):
        store = tmp_path / name
        for texts, backend in zip((FIRST, SECOND), order):
            data = tmp_path / f"{name}-{backend}.txt"
            data.write_text("\n".join(texts) + "\n")
            result = CliRunner().invoke(main, ["featurize", "--model", tiny_model, "--data", str(data), "--store",
                                               str(store), "--dtype", "float32", "--batch-tokens", "128",
                                               "--backend", backend, "--export-cache", str(tmp_path / "cache")])
            assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        assert summary["rows_by_backend"] == {order[0]: len(FIRST), order[1]: len(SECOND)}
        assert [p["backend"] for p in FeatureStore.open(store).manifest["parts"]] == list(order)
        assert verify_store(store) == []
        assert FeatureStore.open(store).fingerprint == FeatureStore.open(torch_store).fingerprint
        assert np.abs(features(store) - features(torch_store)).max() <= 1e-5


def as_made_before(store) -> str:
    """Rewrite `store`'s manifest as headstore wrote it while a runtime was a fingerprint part: `backend` at the top,
    the fingerprint hashing it, no backend per part. Returns that fingerprint."""
    manifest = json.loads((store / "manifest.json").read_text())
    legacy = {**manifest, "backend": "openvino", "parts": [{k: v for k, v in p.items() if k != "backend"}
                                                          for p in manifest["parts"]]}
    legacy["fingerprint"] = fingerprint_of(legacy)
    (store / "manifest.json").write_text(json.dumps(legacy, indent=1))
    return legacy["fingerprint"]


def test_an_fp32_store_with_a_backend_part_is_accepted_as_it_is(tiny_model, torch_store, tmp_path):
    needs("openvino")
    store = tmp_path / "old"
    run(tiny_model, store, FIRST, tmp_path / "cache", backend="openvino")
    old = as_made_before(store)
    assert FeatureStore.open(store).fingerprint != FeatureStore.open(torch_store).fingerprint
    summary = run(tiny_model, store, TEXTS, tmp_path / "cache", backend="torch")  # refused before
    assert summary["n_encoded"] == len(SECOND) and summary["fingerprint"] == old  # kept: its heads stay valid
    assert summary["rows_by_backend"] == {"openvino": len(FIRST), "torch": len(SECOND)}
    assert np.abs(features(store) - features(torch_store)).max() <= 1e-5
    assert verify_store(store) == []


def test_bf16_keeps_a_runtime_in_the_fingerprint(tiny_model):
    parts = {b: fingerprint_parts(FeaturizeConfig(model=tiny_model, backend=b, precision="bf16"), "cpu")
             for b in ("torch", "auto", "openvino")}
    assert "backend" not in parts["torch"] and parts["auto"] == parts["torch"]
    assert parts["openvino"] == {**parts["torch"], "backend": "openvino"}
    fp32 = [fingerprint_parts(FeaturizeConfig(model=tiny_model, backend=b), "cpu") for b in ("torch", "onnx", "auto")]
    assert fp32[0] == fp32[1] == fp32[2] and "backend" not in fp32[0]


def test_a_runtime_that_fails_its_parity_check_is_refused_and_auto_skips_it(tiny_model, tmp_path, monkeypatch):
    needs("openvino")
    cache = tmp_path / "cache"
    run(tiny_model, tmp_path / "ok", FIRST, cache, backend="openvino")  # exported and checked at 1e-5
    monkeypatch.setattr(backends, "EXACT", 0.0)  # a stricter bound: the recorded check no longer answers it
    with pytest.raises(ValueError, match=r"^--backend openvino: its export of bert is .* from torch on the parity probe"):
        run(tiny_model, tmp_path / "refused", FIRST, cache, backend="openvino")
    monkeypatch.setattr(backends, "AUTO_ORDER", ("openvino",))
    summary = run(tiny_model, tmp_path / "auto", FIRST, cache)
    assert summary["backend"] == "torch" and "from torch on the parity probe, over 0" in summary["backend_choice"]


def test_compact_keeps_each_backend_in_its_own_parts(tiny_model, tmp_path):
    needs("openvino")
    store = tmp_path / "s"
    for i, backend in enumerate(("torch", "torch", "openvino", "openvino", "torch")):
        run(tiny_model, store, TEXTS[6 * i: 6 * i + 6], tmp_path / "cache", backend=backend)
    before = FeatureStore.open(store)
    rows = before.features()
    compact_store(store)
    after = FeatureStore.open(store)
    assert [(p["backend"], p["n_rows"]) for p in after.manifest["parts"]] == [("torch", 12), ("openvino", 12),
                                                                              ("torch", 6)]
    assert np.array_equal(after.features(), rows) and verify_store(store) == []


def test_an_fp32_run_says_what_bf16_would_gain_where_it_is_native(tiny_model, tmp_path, monkeypatch):
    native = {"native": True, "bf16_speedup": 2.6}
    monkeypatch.setattr(hardware, "bf16_support", lambda: native)
    summary = run(tiny_model, tmp_path / "native", FIRST, tmp_path / "cache", backend="torch")
    assert "bf16 matmuls ran 2.6x fp32's here" in summary["bf16"]
    monkeypatch.setattr(hardware, "bf16_support", lambda: {"native": False, "slowdown": 80.0})
    assert "bf16" not in run(tiny_model, tmp_path / "emulated", FIRST, tmp_path / "cache", backend="torch")
