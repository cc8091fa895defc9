"""`--engine ray` on a real local Ray (2 CPU actors): same features as the local engine, resumes
after a killed actor or a killed job with every text once, refuses another fingerprint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner

from headstore.cli import main
from headstore.data.text_id import text_ids
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.layout import StoreError
from headstore.featurize.store.verify import verify_store

from featurize_helpers import random_texts
from store_helpers import config

pytest.importorskip("ray")

TEXTS = random_texts(120, seed=11)


@pytest.fixture(scope="module")
def local_store(tiny_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("local") / "s"
    featurize_texts(config(tiny_model, layers=(-1, -2)), TEXTS, path)
    return FeatureStore.open(path)


def assert_same_as_local(path, local):
    store = FeatureStore.open(path)
    assert verify_store(path) == []
    assert sorted(store.texts["text_id"]) == sorted(set(text_ids(TEXTS)))  # every text once
    assert store.fingerprint == local.fingerprint
    ids = text_ids(TEXTS)
    for name in local.arrays:
        diff = np.abs(store.features(store.rows_for(ids), name) - local.features(local.rows_for(ids), name))
        assert diff.max() <= 1e-6


def test_cli_ray_engine_equals_local_and_refuses_another_fingerprint(tiny_model, tmp_path,
                                                                     ray_address, local_store):
    (tmp_path / "a.txt").write_text("\n".join(TEXTS) + "\n")
    args = ["featurize", "--model", tiny_model, "--data", str(tmp_path / "a.txt"), "--store",
            str(tmp_path / "s"), "--layers", "-1,-2", "--dtype", "float32", "--batch-tokens", "128",
            "--device", "cpu", "--engine", "ray", "--workers", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["engine"] == "ray" and summary["n_encoded"] == 120
    assert_same_as_local(tmp_path / "s", local_store)
    before = (tmp_path / "s" / "manifest.json").read_bytes()
    refused = CliRunner().invoke(main, args[:-4] + ["--pooling", "max", "--engine", "ray"])
    assert refused.exit_code != 0 and "fingerprint mismatch" in refused.output
    assert "pooling: store has 'mean', this run has 'max'" in refused.output
    assert "Traceback" not in refused.output
    assert (tmp_path / "s" / "manifest.json").read_bytes() == before


def test_a_killed_actor_is_replaced_and_every_text_lands_once(tiny_model, tmp_path, ray_address,
                                                              local_store, monkeypatch):
    from headstore.featurize.run.ray_engine import featurize_texts_ray

    marker = tmp_path / "crashed"
    monkeypatch.setenv("HEADSTORE_CRASH_AT", "actor_segment:2")
    monkeypatch.setenv("HEADSTORE_CRASH_MARKER", str(marker))
    summary = featurize_texts_ray(config(tiny_model, layers=(-1, -2)), TEXTS, tmp_path / "s",
                                  workers=2, segment_texts=15)
    assert marker.exists()  # an actor did die mid-run
    assert summary["n_encoded"] == 120 and summary["n_segments"] == 8
    assert_same_as_local(tmp_path / "s", local_store)


CHILD = textwrap.dedent("""
    import json, sys
    import ray
    args = json.loads(sys.argv[1])
    ray.init(address=args["address"], log_to_driver=False)
    from headstore.featurize.encoder.config import FeaturizeConfig
    from headstore.featurize.run.ray_engine import featurize_texts_ray
    config = FeaturizeConfig(**{**args["config"], "layers": tuple(args["config"]["layers"])})
    featurize_texts_ray(config, args["texts"], args["store"], workers=2, segment_texts=15)
""")


def test_a_killed_job_resumes_by_skipping_committed_segments(tiny_model, tmp_path, ray_address,
                                                             local_store):
    from headstore.featurize.run.ray_engine import featurize_texts_ray

    cfg = config(tiny_model, layers=(-1, -2))
    args = {"address": ray_address, "texts": TEXTS, "store": str(tmp_path / "s"),
            "config": {**json.loads(cfg.to_json()), "layers": [-1, -2]}}
    env = {**os.environ, "HEADSTORE_CRASH_AT": "committed:3", "TOKENIZERS_PARALLELISM": "false"}
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], env=env,
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    assert FeatureStore.open(tmp_path / "s").n_texts == 45  # three whole segments committed
    summary = featurize_texts_ray(cfg, TEXTS, tmp_path / "s", workers=2, segment_texts=15)
    assert summary["n_already_stored"] == 45 and summary["n_encoded"] == 75
    assert_same_as_local(tmp_path / "s", local_store)
    with pytest.raises(StoreError, match="fingerprint mismatch"):
        featurize_texts_ray(config(tiny_model, layers=(-1,)), TEXTS, tmp_path / "s")


def test_ray_engine_encodes_each_role_under_its_prompt_as_local(tmp_path, ray_address):
    """A BEIR folder through a prompted sentence-transformers model (its Pooling leaves the prompt out): the
    ray engine stores the same (prompt, text) rows as the local engine."""
    from arch_models import build_hf, build_st
    from test_prompts_roles import PROMPTS, beir

    from headstore.featurize.encoder.config import FeaturizeConfig
    from headstore.featurize.run.local import featurize

    st_dir = build_st(tmp_path / "st", build_hf(tmp_path / "hf", "bert"), "mean", None, True,
                      include_prompt=False, prompts=PROMPTS)
    folder = beir(tmp_path / "beir")
    featurize(FeaturizeConfig(model=str(st_dir), dtype="float32"), [folder], tmp_path / "local")
    args = ["featurize", "--model", str(st_dir), "--data", str(folder), "--store", str(tmp_path / "ray"),
            "--dtype", "float32", "--device", "cpu", "--engine", "ray", "--workers", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    local, ray = FeatureStore.open(tmp_path / "local"), FeatureStore.open(tmp_path / "ray")
    assert ray.fingerprint == local.fingerprint and ray.prompts == PROMPTS
    ids = sorted(local.texts["text_id"])
    assert sorted(ray.texts["text_id"]) == ids and verify_store(tmp_path / "ray") == []
    assert np.abs(ray.features(ray.rows_for(ids)) - local.features(local.rows_for(ids))).max() <= 1e-6
