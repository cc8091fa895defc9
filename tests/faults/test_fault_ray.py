"""The Ray engines under faults (one local Ray for the module; Ray is slow to start, so three cases): a write
error in the driver's commit ends the run with the OS error and the same command resumes; a segment that
kills every actor it reaches ends the run once the bounded restarts are spent (Ray Data alone retries it
forever); `cli grid --engine ray`: a write error in the driver (the grid's one writer) ends the grid, and the
same command resumes to the local engine's figures. (A grid's worker or node dying: tests/heads/test_grid_ray.py.)"""
from __future__ import annotations

import numpy as np
import pytest
from fault_world import assert_close, assert_ok, assert_write_error, bounded, cli, grid_rows, random_texts
from fault_inject import Fault, injected

from headstore.data.text_id import text_ids
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.verify import verify_store
from headstore.featurize.store.writer import acquire_lock

ray = pytest.importorskip("ray")
TEXTS = random_texts(60, seed=13, max_words=12)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def small(model) -> FeaturizeConfig:
    return FeaturizeConfig(model=str(model), dtype="float32", batch_tokens=128, commit_seconds=0, device="cpu")


def test_a_write_error_in_the_driver_commit_ends_the_ray_run_and_it_resumes(world, tmp_path, local_ray):
    from headstore.featurize.run.ray_engine import featurize_texts_ray

    store = tmp_path / "s"
    # parquet writes: the 3 staged segments, then one texts part per commit: the 5th is the second commit's
    with injected(Fault("parquet", "ENOSPC", 5)), pytest.raises(OSError, match="No space left on device"):
        bounded(lambda: featurize_texts_ray(small(world["model"]), TEXTS, store, workers=1, segment_texts=20))
    acquire_lock(store).release()  # the lock is free
    assert verify_store(store) == [] and FeatureStore.open(store).n_texts == 20  # the first segment only
    summary = bounded(lambda: featurize_texts_ray(small(world["model"]), TEXTS, store, workers=1, segment_texts=20))
    assert summary["n_already_stored"] == 20 and summary["n_encoded"] == 40
    featurize_texts(small(world["model"]), TEXTS, tmp_path / "local")
    ray_store, local = FeatureStore.open(store), FeatureStore.open(tmp_path / "local")
    assert sorted(ray_store.texts["text_id"]) == sorted(text_ids(TEXTS))  # every text once
    ids = text_ids(TEXTS)
    diff = np.abs(ray_store.features(ray_store.rows_for(ids)) - local.features(local.rows_for(ids)))
    assert diff.max() <= 1e-6


def test_a_segment_that_kills_every_actor_ends_the_run(world, tmp_path, local_ray, monkeypatch):
    import headstore.featurize.run.ray_engine as ray_engine

    monkeypatch.setattr(ray_engine, "ACTOR_RESTARTS", 0)  # 3 in use; 0 (one actor dies, no retry) keeps it short
    monkeypatch.setenv("HEADSTORE_CRASH_AT", "actor_segment_always:1")
    store = tmp_path / "s"
    # one segment: two actors in all (the one killed, the one that finds the attempt spent); each actor
    # starts a process that imports torch, and a second segment would take a third
    with pytest.raises(ray_engine.WorkersFailed, match="actors died on a segment: segment 0"):
        bounded(lambda: ray_engine.featurize_texts_ray(small(world["model"]), TEXTS, store, workers=1,
                                                       segment_texts=len(TEXTS)))
    assert FeatureStore.open(store).n_texts == 0 and verify_store(store) == []
    acquire_lock(store).release()


def test_a_write_error_in_the_ray_grid_driver_ends_the_grid_and_it_resumes(world, tmp_path, local_ray):
    grid = tmp_path / "grid.toml"  # two stacks: the second is in flight when the first one's results fail to write
    grid.write_text(world["grid"].read_text().replace("[fixed]", "depth = [1, 2]\n[fixed]"))
    args = ("grid", "--store", world["store"], "--data", world["pairs"], "--grid", grid)
    assert_ok(cli(*args, "--out", tmp_path / "local"))
    out = tmp_path / "ray"
    fault = Fault("parquet", "ENOSPC", 1)  # the first results.parquet: the first stack back
    assert_write_error(cli(*args, "--out", out, "--engine", "ray", fault=fault), fault)
    assert fault.fired and not (out / "results.parquet").exists()
    assert_ok(cli(*args, "--out", out, "--engine", "ray"))  # the same command, the cause gone
    rows = grid_rows(out)
    reference = grid_rows(tmp_path / "local")
    assert rows.keys() == reference.keys()  # every head once
    assert_close(rows, reference)  # 1 torch thread per stack here, the local engine's default there
