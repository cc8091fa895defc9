"""A run's settings are resolved once, at the door (featurize.encoder.resolved): each `auto`, None and 0 becomes the
value for the device, the store's fingerprint parts come from the resolved values alone, and what is resolved is
frozen plain values a Ray actor can receive."""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest

from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.encoder.resolved import resolve
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.layout import fingerprint_of
from headstore.featurize.store.reader import FeatureStore


def test_every_default_is_resolved_for_the_device(tiny_model):
    given = FeaturizeConfig(model=tiny_model, batch_tokens=None)  # None: as `cli featurize` without --batch-tokens
    cpu, cuda = resolve(given, "cpu"), resolve(given, "cuda")  # an explicit device: no GPU needed to resolve for one
    assert (cpu.device, cpu.precision, cpu.numerics, cpu.packing) == ("cpu", "fp32", "fp32", False)
    assert (cuda.device, cuda.precision, cuda.numerics, cuda.packing) == ("cuda", "bf16", "bf16-weights", True)
    assert (cpu.batch_tokens, cpu.batch_overhead_tokens, cpu.tokenize_threads) == (4096, 128, 1)
    assert (cuda.batch_tokens, cuda.batch_overhead_tokens, cuda.tokenize_threads) == (65536, 65536, 4)
    given_bf16 = dataclasses.replace(given, precision="bf16", batch_tokens=2048, tokenize_threads=3)
    assert (resolve(given_bf16, "cpu").batch_overhead_tokens, resolve(given_bf16, "cpu").numerics) == (512, "bf16-autocast")
    assert resolve(given_bf16, "cuda").batch_overhead_tokens == 2048 and resolve(given_bf16, "cuda").tokenize_threads == 3
    assert cpu.max_length == 24 and cpu.dim == 32 and cpu.prompts == {"query": "", "document": ""}


def test_the_resolved_settings_are_frozen_and_travel_to_an_actor(tiny_model):
    settings = resolve(FeaturizeConfig(model=tiny_model, layers=(-1, 0)), "cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.device = "cuda"
    assert pickle.loads(pickle.dumps(settings)) == settings  # what Ray sends each SegmentEncoder


def test_the_store_is_fingerprinted_from_the_resolved_parts(tiny_model, texts, tmp_path):
    config = FeaturizeConfig(model=tiny_model, batch_tokens=None, pooling="cls", layers=(-1, 1), device="cpu",
                             query_prompt="q: ")
    featurize_texts(config, texts[:8], tmp_path / "s")
    store = FeatureStore.open(tmp_path / "s")
    parts = resolve(config).parts()
    assert store.fingerprint == fingerprint_of(parts)
    assert {k: store.manifest[k] for k in parts} == parts
    saved = json.loads((tmp_path / "s" / "config.json").read_text())  # the options as given, with the budget used
    assert saved["batch_tokens"] == 4096 and saved["precision"] == "auto" and saved["device"] == "cpu"
