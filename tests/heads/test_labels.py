"""Labelled-text tasks: planted classes learned, P x K batches, the few-shot protocol, and the
evaluation metrics against independent references (sklearn's k-NN, nDCG and AP; the IR metrics' loop)."""
import dataclasses

import numpy as np
import polars as pl
import pytest
import torch
from sklearn.metrics import average_precision_score, ndcg_score
from sklearn.neighbors import KNeighborsClassifier

from headstore.heads.settings.config import TrainConfig, stack_key
from headstore.heads.evaluation.evaluate import embedder, evaluate_split
from headstore.heads.kinds.label_eval import ranking_metrics
from headstore.heads.kinds import for_training
from headstore.heads.scoring.metrics import ir_metrics_per_query
from headstore.heads.settings.config import HeadConfig
from headstore.heads.kinds import load_task
from headstore.heads.training.train import train_one

from .label_world import MemoryStore, planted_labels

FAST = dict(normalize="none", epochs=8, batch_size=24, lr=1e-2, patience=8, impostors="all")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return planted_labels(tmp_path_factory.mktemp("labels"))


@pytest.mark.parametrize("loss,hierarchy", [("supcon-kl", False), ("supcon-kl", True), ("l1-energy", True)])
def test_planted_classes_are_learned_far_above_chance(planted, loss, hierarchy):
    path, store, X = planted
    cfg = TrainConfig(loss=loss, hierarchy=hierarchy, **FAST)
    task = for_training(load_task(str(path), store, "labels?label_sep=."), cfg)
    base, _ = evaluate_split(task, "test", embedder(None, X), ("l1",))
    model, norm, run = train_one(task, X, HeadConfig(depth=1, out_dim=8, in_dim=16, residual=False), cfg, progress=False)
    res, items = evaluate_split(task, "test", embedder(model, norm(X)), ("l1",))
    chance = 1 / 6
    assert base[0]["manhattan_knn_accuracy"] < 0.6  # the loud dims hide the classes from frozen k-NN
    assert res[0]["manhattan_knn_accuracy"] > 0.85 > 4 * chance, res
    assert res[0]["manhattan_ndcg@10"] > 0.8 and res[0]["manhattan_map"] > 0.6
    assert res[0]["manhattan_knn_accuracy_level1"] >= res[0]["manhattan_knn_accuracy_level2"]
    assert items[0]["manhattan"].shape == (len(task.eval_sets["test"]),)
    assert run.history[-1]["loss"] < run.history[0]["loss"]


def test_batches_hold_p_classes_times_k_texts(planted):
    path, store, _ = planted
    cfg = TrainConfig(loss="supcon-kl", per_class=4, batch_size=16)
    task = for_training(load_task(str(path), store, "labels"), cfg)
    gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
    batches = task.sample_batches([cfg, dataclasses.replace(cfg, seed=1)], gens, 16, 5)
    assert batches.shape == (2, 5, 16)
    classes = task.reference.classes
    for b in batches.reshape(-1, 16).numpy():
        values, counts = np.unique(classes[b], return_counts=True)
        assert len(values) == 4 and (counts == 4).all()
    assert not torch.equal(batches[0], batches[1])  # each head its own draw
    with pytest.raises(ValueError, match="was built for"):
        task.sample_batches([dataclasses.replace(cfg, shots=8)], gens[:1], 16, 1)


def test_few_shot_draws_n_per_class_by_seed_and_has_no_dev(planted):
    path, store, _ = planted
    task = load_task(str(path), store, "labels")
    assert set(task.eval_sets) == {"dev", "test"} and "of each class" in task.dev_note
    cfg = TrainConfig(loss="supcon-kl", shots=5, seed=3)
    a, b = for_training(task, cfg), for_training(task, cfg)
    c = for_training(task, dataclasses.replace(cfg, seed=4))
    assert np.array_equal(a.reference.rows, b.reference.rows) and not np.array_equal(a.reference.rows, c.reference.rows)
    assert (np.bincount(a.reference.classes) == 5).all() and set(a.eval_sets) == {"test"}
    assert np.isin(a.reference.rows, task.every_train.rows).all()  # drawn from every train text, the dev slice
    # included (issue 54 item 11: few-shot has no dev)
    assert len(a.pool) == len(task.every_train) > len(task.pool)
    assert not np.isin(task.eval_sets["dev"].rows, task.pool.rows).any()
    assert stack_key(cfg) != stack_key(dataclasses.replace(cfg, seed=4))  # few-shot seeds never share a stack
    assert stack_key(TrainConfig(seed=1)) == stack_key(TrainConfig(seed=2))
    model, _, run = train_one(a, torch.randn(480, 16), HeadConfig(depth=1, in_dim=16), dataclasses.replace(cfg, epochs=3),
                              progress=False)
    assert run.best_epoch == 3 and "dev_manhattan_knn_accuracy" not in run.history[0]  # no dev: the last epoch


def test_losses_that_do_not_fit_the_data_are_refused(planted):
    path, store, X = planted
    task = load_task(str(path), store, "labels")
    with pytest.raises(ValueError, match="trains on pairs; for labelled texts use"):
        train_one(task, X, HeadConfig(depth=1, in_dim=16), TrainConfig(loss="mnr"), progress=False)
    with pytest.raises(ValueError, match="--hierarchy needs hierarchical labels"):
        for_training(task, TrainConfig(loss="supcon", hierarchy=True))


def test_knn_and_retrieval_agree_with_independent_references():
    rng = np.random.default_rng(0)
    ref, query = rng.normal(size=(60, 5)), rng.normal(size=(25, 5))
    ref_cls, q_cls = rng.integers(0, 3, 60), rng.integers(0, 3, 25)
    E = torch.cdist(torch.tensor(query), torch.tensor(ref), p=1)
    got = ranking_metrics(E, q_cls, ref_cls, 3, full=True)
    knn = KNeighborsClassifier(n_neighbors=10, metric="manhattan").fit(ref, ref_cls)
    proba = knn.predict_proba(query)  # vote shares; where two classes tie our tie-break decides
    clear = np.sort(proba, axis=1)[:, -1] > np.sort(proba, axis=1)[:, -2]
    assert clear.sum() > 15 and np.array_equal(got["knn"][clear], knn.predict(query)[clear])
    ranked = torch.argsort(E, dim=1).numpy()
    qrels = {f"q{i}": {f"d{j}": 1 for j in np.flatnonzero(ref_cls == q_cls[i])} for i in range(25)}
    _, per_query = ir_metrics_per_query(ranked, qrels, (10, 60), query_ids=[f"q{i}" for i in range(25)],
                                        doc_ids=[f"d{j}" for j in range(60)])
    assert np.allclose(got["ndcg@10"], per_query["ndcg@10"]) and np.allclose(got["map"], per_query["map@60"])
    hits = (ref_cls[None, :] == q_cls[:, None]).astype(int)  # (25, 60) binary relevance, no ties in E
    assert np.allclose(got["ndcg@10"], [ndcg_score(h[None], -e[None], k=10) for h, e in zip(hits, E.numpy())])
    assert np.allclose(got["map"], [average_precision_score(h, -e) for h, e in zip(hits, E.numpy())])


def test_unseen_test_labels_are_reported_and_count_as_errors(tmp_path):
    texts = [f"t{i}" for i in range(12)]
    labels = ["a", "b"] * 5 + ["z", "z"]
    split = ["train"] * 10 + ["test", "test"]
    path = tmp_path / "u.parquet"
    pl.DataFrame({"text": texts, "label": labels, "split": split}).write_parquet(path)
    task = load_task(str(path), MemoryStore(texts))
    assert task.report["unseen_labels"] == {"test": {"n_texts": 2, "labels": {"z": 2}}}
    res, _ = evaluate_split(task, "test", embedder(None, torch.randn(12, 4)), ("l1",))
    assert res[0]["probe_accuracy"] == 0.0 and res[0]["manhattan_knn_accuracy"] == 0.0
