"""Issue 32's suspicions of hangs, locks, queues and overflow, each settled by a test (the Ray one is in
test_fault_ray.py), and `cli store migrate` needing no encoder where nothing is encoded."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch
from fault_world import assert_ok, cli, random_texts
from fault_inject import Fault, injected

from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.encoder.encode import Tokenized, prefetch_batches
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.verify import verify_store
from headstore.featurize.store.writer import acquire_lock

TEXTS = random_texts(30, seed=3, max_words=12)


def small(model, **kw) -> FeaturizeConfig:
    return FeaturizeConfig(**{"model": str(model), "dtype": "float32", "batch_tokens": 128, "commit_seconds": 0,
                              "device": "cpu", **kw})


def test_a_failed_featurize_in_process_releases_the_store_lock(world, tmp_path):
    """Confirmed (the lock stayed held: a notebook's next featurize was refused as 'another process is
    writing'): a writer that fails releases it; the next call in the same process resumes."""
    store = tmp_path / "s"
    with injected(Fault("zarr", "ENOSPC", 6)), pytest.raises(OSError, match="No space left"):
        featurize_texts(small(world["model"]), TEXTS, store)
    acquire_lock(store).release()  # free again
    featurize_texts(small(world["model"]), TEXTS, store)
    assert verify_store(store) == [] and FeatureStore.open(store).n_texts == len(TEXTS)


@pytest.mark.parametrize("how", ["closed", "failed"])
def test_the_prefetch_thread_ends_when_its_consumer_stops(how):
    """Confirmed (the collate thread stayed blocked on its full queue for good, holding pinned batches): it
    ends once the consumer stops, whether it finished early or failed."""
    tok = Tokenized(ids=[np.arange(5, dtype=np.int32)] * 40, n_tokens=np.full(40, 5, np.int32),
                    truncated=np.zeros(40, bool))

    def consume():
        batches = prefetch_batches(tok, np.arange(40), [(i, i + 1) for i in range(40)], 0, pin=False, depth=2)
        next(batches)
        if how == "closed":
            batches.close()
            return
        for _ in batches:
            raise RuntimeError("the forward failed")

    try:
        consume()
    except RuntimeError:
        pass  # the failure handled: its frames (and the consumer's generator) are gone
    alive = [t for t in threading.enumerate() if t.name == "headstore-collate"]
    for t in alive:
        t.join(5)
    assert not any(t.is_alive() for t in alive)


@pytest.fixture(scope="module")
def hot_model(tmp_path_factory):
    """The tiny BERT with a last LayerNorm scaled 1e5: features far past float16's 65504."""
    from featurize_helpers import build_tiny_bert
    from transformers import BertModel

    folder = tmp_path_factory.mktemp("hot")
    build_tiny_bert(folder)
    model = BertModel.from_pretrained(folder)
    with torch.no_grad():
        model.encoder.layer[-1].output.LayerNorm.weight.mul_(1e5)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def test_a_float16_overflow_is_refused_at_encode_time_naming_the_text(hot_model, tmp_path):
    """Confirmed (inf was committed and only a later read refused the rows): the batch is refused before
    its commit, naming a text and the fix; nothing non-finite is stored."""
    store = tmp_path / "s"
    with pytest.raises(ValueError, match=r"text [0-9a-f]{32} .*float16's range.*--dtype float32"):
        featurize_texts(small(hot_model, dtype="float16"), TEXTS, store)
    if (store / "manifest.json").is_file():
        assert verify_store(store) == []
    featurize_texts(small(hot_model), TEXTS, tmp_path / "f32")  # float32 holds them
    assert np.isfinite(FeatureStore.open(tmp_path / "f32").features()).all()
    result = cli("featurize", "--model", hot_model, "--data", _texts_file(tmp_path), "--store", tmp_path / "c")
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1].startswith("Error: text "), result.output


def _texts_file(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return path


def test_store_migrate_needs_no_encoder_where_nothing_is_encoded(world, tmp_path, monkeypatch):
    """Item 9: a current store of a mean-pooled model named by a relative path, migrated from another folder,
    needs no change (said so, with how to check the Normalize); its format-1 copy migrates without it."""
    import shutil

    from store_helpers import make_format1_copy

    shutil.copytree(world["model"], tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    featurize_texts(small("model", pooling="mean"), TEXTS, tmp_path / "s")  # config.json: model "model"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = cli("store", "migrate", tmp_path / "s")
    assert_ok(result)
    summary = json.loads(result.output)
    assert summary["status"] == "needs no change" and "--model" in summary["note"]
    make_format1_copy(tmp_path / "s", tmp_path / "v1")
    result = cli("store", "migrate", tmp_path / "v1")
    assert_ok(result)
    assert json.loads(result.output)["status"] == "migrated to format 2"
    assert verify_store(tmp_path / "v1") == [] and FeatureStore.open(tmp_path / "v1").format_version == 2


def test_a_soup_never_mixes_query_side_heads_with_heads_of_both_sides(world, tmp_path):
    """Confirmed (START_KEYS left `sides` out: the soup of 3 below averaged query-side and both-sides
    weights): a soup takes heads of its first head's sides only."""
    import polars as pl

    from headstore.heads.artefacts.soup import soup_ids

    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nsides = ["both", "query"]\nlr = [1e-3, 3e-3]\n[fixed]\nepochs = 1\nhidden = 16\n'
                    'batch_size = 8\nmined_k = 2\nseed = 0\n')
    out = tmp_path / "g"
    assert_ok(cli("grid", "--store", world["store"], "--data", world["pairs"], "--grid", grid, "--out", out))
    sides = dict(pl.read_parquet(out / "results.parquet").select("head_id", "sides").iter_rows())
    pair = soup_ids(out, 2)
    assert len({sides[h] for h in pair}) == 1
    with pytest.raises(ValueError, match="a soup of 3 needs 3 heads"):
        soup_ids(out, 3)


def test_a_grown_store_trains_no_head_again(world, store_copy, tmp_path):
    """A grid resumed after the store grew: an anchored head draws its anchor rows from the task's own texts
    (here its --unlabeled ones), never from the store's other rows (issue 54, item 3), so every head resumes (its
    id held the store's row count, and the anchor drew from every row)."""
    import polars as pl

    from fault_world import STORE_OPTS

    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nanchor_weight = [0.0, 0.1]\n[fixed]\nepochs = 1\nhidden = 16\nbatch_size = 8\n'
                    'mined_k = 2\nseed = 0\n')
    assert_ok(cli("featurize", "--model", world["model"], "--unlabeled", world["more"], "--store", store_copy,
                  *STORE_OPTS))
    out = tmp_path / "g"
    args = ("grid", "--store", store_copy, "--data", world["pairs"], "--grid", grid, "--out", out,
            "--unlabeled", world["more"])
    assert_ok(cli(*args))
    first = set(pl.read_parquet(out / "results.parquet")["head_id"])
    other = tmp_path / "other.txt"
    other.write_text("\n".join(random_texts(25, seed=11, max_words=12)) + "\n")
    assert_ok(cli("featurize", "--model", world["model"], "--data", other, "--store", store_copy, *STORE_OPTS))
    assert_ok(cli(*args))
    frame = pl.read_parquet(out / "results.parquet")
    assert set(frame["head_id"]) == first and frame.height == 2
