"""`--pooling model`: every stored row equals `SentenceTransformer(dir).encode` of the same text (fp32 store),
for tiny random encoders of several architectures (tests/featurize/arch_models.py) with cls, lasttoken and
mean pooling, Dense and Normalize; a plain checkpoint keeps mean pooling; another pooling is refused."""
from __future__ import annotations

import json

import numpy as np
import pytest
from arch_models import ARCHES, build_hf, build_st, has_arch
from featurize_helpers import random_texts

from headstore.data.text_id import text_id
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.layout import StoreError

pytest.importorskip("sentence_transformers")

# mean alone; cls then a Dense (tanh) then Normalize; lasttoken then Normalize; two modes concatenated
SETUPS = {"mean": ("mean", None, False), "cls-dense-normalize": ("cls", 16, True),
          "lasttoken-normalize": ("lasttoken", None, True),
          "max+weightedmean+sqrt": (("max", "weightedmean", "mean_sqrt_len_tokens"), None, False)}
# varied lengths in one batch (padding), several past the 24-token max length, and case that matters
TEXTS = random_texts(10, seed=3, max_words=40) + ["Cat Dog", "cat dog", "one"]


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("arches")
    return {arch: build_hf(root / arch, arch) for arch in ARCHES if has_arch(arch)}


def stored(store_path, texts):
    store = FeatureStore.open(store_path)
    return store.features(store.rows_for([text_id(t) for t in texts]))


@pytest.mark.parametrize("setup", sorted(SETUPS))
@pytest.mark.parametrize("arch", ARCHES)
def test_stored_rows_equal_sentence_transformers(arch, setup, hf_models, tmp_path):
    if arch not in hf_models:
        pytest.skip(f"transformers has no {arch}")
    from sentence_transformers import SentenceTransformer

    modes, dense, normalize = SETUPS[setup]
    st_dir = build_st(tmp_path / "st", hf_models[arch], modes, dense, normalize)
    featurize_texts(FeaturizeConfig(model=str(st_dir), dtype="float32"), TEXTS, tmp_path / "store")
    reference = SentenceTransformer(str(st_dir), device="cpu").encode(TEXTS, convert_to_numpy=True)
    got = stored(tmp_path / "store", TEXTS)
    assert got.shape == reference.shape
    assert np.abs(got - reference).max() <= 1e-5
    manifest = FeatureStore.open(tmp_path / "store").manifest
    assert manifest["pooling"] == "+".join((modes,) if isinstance(modes, str) else modes)
    assert manifest.get("normalize", False) == normalize and bool(manifest.get("dense")) == bool(dense)


def test_plain_checkpoint_is_mean_pooled_and_overrides_apply(hf_models, tmp_path):
    from sentence_transformers import SentenceTransformer

    plain = hf_models["roberta"]  # no modules.json
    featurize_texts(FeaturizeConfig(model=str(plain), dtype="float32"), TEXTS, tmp_path / "plain")
    assert FeatureStore.open(tmp_path / "plain").manifest["pooling"] == "mean"
    st_mean = build_st(tmp_path / "st-mean", plain, "mean")
    reference = SentenceTransformer(str(st_mean), device="cpu").encode(TEXTS, convert_to_numpy=True)
    assert np.abs(stored(tmp_path / "plain", TEXTS) - reference).max() <= 1e-5
    # --pooling cls on a model whose own pooling is mean: the override, as sentence-transformers' cls
    featurize_texts(FeaturizeConfig(model=str(st_mean), pooling="cls", dtype="float32"), TEXTS, tmp_path / "cls")
    st_cls = build_st(tmp_path / "st-cls", plain, "cls")
    reference = SentenceTransformer(str(st_cls), device="cpu").encode(TEXTS, convert_to_numpy=True)
    assert np.abs(stored(tmp_path / "cls", TEXTS) - reference).max() <= 1e-5


def test_store_refused_for_another_pooling(hf_models, tmp_path):
    st_dir = build_st(tmp_path / "st", hf_models["bert"], "cls", None, True)
    featurize_texts(FeaturizeConfig(model=str(st_dir), dtype="float32"), TEXTS[:4], tmp_path / "store")
    with pytest.raises(StoreError, match="pooling: store has 'cls', this run has 'mean'"):
        featurize_texts(FeaturizeConfig(model=str(st_dir), pooling="mean", dtype="float32"), TEXTS, tmp_path / "store")
    # the same model with its Dense weights changed: another fingerprint (the Dense sha256 is a part)
    other = build_st(tmp_path / "st2", hf_models["bert"], "cls", 8, True)
    featurize_texts(FeaturizeConfig(model=str(other), dtype="float32"), TEXTS[:4], tmp_path / "store2")
    (other / "2_Dense" / "model.safetensors").write_bytes(
        (tmp_path / "st2" / "2_Dense" / "model.safetensors").read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(StoreError, match="dense"):
        featurize_texts(FeaturizeConfig(model=str(other), dtype="float32"), TEXTS, tmp_path / "store2")


def test_unsupported_modules_are_refused_by_name(hf_models, tmp_path):
    st_dir = build_st(tmp_path / "st", hf_models["bert"], "mean")
    modules = json.loads((st_dir / "modules.json").read_text())
    modules.append({"idx": 9, "name": "9", "path": "", "type": "my_package.CustomLayer"})
    (st_dir / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="CustomLayer.*--pooling mean"):
        featurize_texts(FeaturizeConfig(model=str(st_dir)), TEXTS[:2], tmp_path / "store")
    featurize_texts(FeaturizeConfig(model=str(st_dir), pooling="mean"), TEXTS[:2], tmp_path / "store")  # override


def test_migrate_records_normalize_and_keeps_the_numbers(hf_models, tmp_path):
    """A mean-pooled store of a mean-then-Normalize model (MiniLM's modules) made before `--pooling model`
    becomes its `--pooling model` store by `cli store migrate`: rows read unit-normalised, nothing encoded."""
    from click.testing import CliRunner

    from headstore.cli import main

    st_dir = build_st(tmp_path / "st", hf_models["bert"], "mean", None, True)
    old = tmp_path / "store"
    featurize_texts(FeaturizeConfig(model=str(st_dir), pooling="mean", dtype="float32"), TEXTS[:6], old)
    raw = stored(old, TEXTS[:6])
    with pytest.raises(StoreError, match="cli store migrate"):  # the default (--pooling model) refuses it
        featurize_texts(FeaturizeConfig(model=str(st_dir), dtype="float32"), TEXTS, old)
    result = CliRunner().invoke(main, ["store", "migrate", str(old)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["normalize_recorded"] is True
    migrated = stored(old, TEXTS[:6])
    np.testing.assert_allclose(migrated, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=0, atol=1e-7)
    featurize_texts(FeaturizeConfig(model=str(st_dir), dtype="float32"), TEXTS, old)  # now it takes more texts
    fresh = tmp_path / "fresh"
    featurize_texts(FeaturizeConfig(model=str(st_dir), dtype="float32"), TEXTS, fresh)
    assert FeatureStore.open(old).fingerprint == FeatureStore.open(fresh).fingerprint
    np.testing.assert_allclose(stored(old, TEXTS), stored(fresh, TEXTS), rtol=0, atol=1e-6)
    result = CliRunner().invoke(main, ["store", "migrate", str(old)])  # a second time: nothing to do
    assert result.exit_code == 0 and json.loads(result.output)["normalize_recorded"] is False
