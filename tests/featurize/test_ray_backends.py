"""`--engine ray` with every backend (torch, onnx, openvino) on a real local Ray: each actor prepares the torch
encoder (numerics) before swapping in the runtime model, and stores what the local engine stores with that
backend (the same fingerprint, each segment recording the backend, features within the backend's tolerance of the
local engine's and of torch's)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from headstore.cli import main
from headstore.data.text_id import text_ids
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.layout import segment_backends
from headstore.featurize.store.verify import verify_store

from featurize_helpers import random_texts
from store_helpers import config
from test_backends import needs

pytest.importorskip("ray")

TEXTS = random_texts(40, seed=23, max_words=40)  # varied lengths: padded batches, some cut at max length
# the local engine's features, same backend: the same plan and shapes (one segment, one window), so within
# float rounding; torch's: a runtime fuses and orders the maths differently (backends: within 1e-5 in fp32)
SAME_BACKEND, VERSUS_TORCH = {"torch": 1e-6, "onnx": 1e-6, "openvino": 1e-6}, {"torch": 1e-6, "onnx": 1e-5,
                                                                              "openvino": 1e-5}


def features(path) -> dict[str, np.ndarray]:
    store = FeatureStore.open(path)
    rows = store.rows_for(text_ids(TEXTS))
    return {name: store.features(rows, name) for name in store.arrays}


@pytest.mark.parametrize("backend", ["torch", "onnx", "openvino"])
def test_ray_engine_runs_every_backend_as_the_local_engine(backend, tiny_model, tmp_path_factory, ray_address):
    needs(backend)
    tmp = tmp_path_factory.mktemp(f"ray-{backend}")
    cache = tmp_path_factory.getbasetemp() / "ray-exports"  # one export per backend, shared by the engines
    options = dict(layers=(-1, -2), backend=backend, export_cache=str(cache))
    featurize_texts(config(tiny_model, **options), TEXTS, tmp / "local")
    torch_path = tmp_path_factory.getbasetemp() / "ray-torch-reference"
    if not torch_path.exists():
        featurize_texts(config(tiny_model, layers=(-1, -2)), TEXTS, torch_path)
    (tmp / "a.txt").write_text("\n".join(TEXTS) + "\n")
    args = ["featurize", "--model", tiny_model, "--data", str(tmp / "a.txt"), "--store", str(tmp / "ray"),
            "--layers", "-1,-2", "--dtype", "float32", "--batch-tokens", "128", "--device", "cpu",
            "--backend", backend, "--export-cache", str(cache), "--engine", "ray", "--workers", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["engine"] == "ray" and summary["n_encoded"] == len(set(TEXTS))
    assert verify_store(tmp / "ray") == []
    ray, local = FeatureStore.open(tmp / "ray"), FeatureStore.open(tmp / "local")
    assert ray.fingerprint == local.fingerprint and segment_backends(ray.manifest) == {backend: len(set(TEXTS))}
    got, same, reference = features(tmp / "ray"), features(tmp / "local"), features(torch_path)
    for name in same:
        assert np.abs(got[name] - same[name]).max() <= SAME_BACKEND[backend], name
        assert np.abs(got[name] - reference[name]).max() <= VERSUS_TORCH[backend], name


def test_a_failed_actor_is_reported_by_its_own_exception():
    """WorkersFailed names what the actor raised (in the traceback Ray forwards), not Ray's wrapper line."""
    from headstore.featurize.run.ray_engine import SEGMENT_DIED, _actor_error

    wrapped = ("\x1b[36mray::MapWorker(MapBatches(SegmentEncoder)).submit()\x1b[39m (pid=5395, ip=192.0.2.2)\n"
               '  File "featurize/encoder/packed.py", line 229, in prepare_encoder\n'
               "AttributeError: 'RuntimeModel' object has no attribute 'forward'\n\n"
               "The above exception was the direct cause of the following exception:\n\n"
               "ray.exceptions.UserCodeException: UDF failed to process a data block.\n")
    assert _actor_error(RuntimeError(wrapped)) == "AttributeError: 'RuntimeModel' object has no attribute 'forward'"
    died = f"{wrapped}RuntimeError: {SEGMENT_DIED}: segment 3 (segment-000003.parquet) killed the 4 actors\n"
    assert _actor_error(RuntimeError(died)).startswith(f"RuntimeError: {SEGMENT_DIED}: segment 3")
    assert _actor_error(RuntimeError("\x1b[36mray::X.submit()\x1b[39m (pid=1)")) == "ray::X.submit() (pid=1)"
