"""Label heads that beat what a user tries first (issue 39): the tuned probe against plain scikit-learn loops,
the classifier head (`--loss ce`) on separable data, and its exported model against `Head.predict`."""
import json
import math
import random

import numpy as np
import polars as pl
import pytest
import torch
from click.testing import CliRunner
from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import Normalizer, StandardScaler

import headstore
from headstore.cli import main
from headstore.heads.evaluation.evaluate import embedder, evaluate_split
from headstore.heads.kinds import for_training, load_task
from headstore.heads.kinds.label_probe import cv_folds, tuned_probe
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.training.run import head_shape
from headstore.heads.training.train import train_one

from .finetune_world import WORDS, tiny_bert
from .label_world import MemoryStore

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # the reference loop calls sklearn as a user would
CS = [0.1, 1.0, 10.0, 100.0]
SCALERS = {"l2": Normalizer, "standardize": StandardScaler}


def blobs(n_classes=4, per_class=30, dim=12, spread=1.0, scale=None, seed=0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(n_classes), per_class)
    means = 3.0 * rng.normal(size=(n_classes, dim))
    x = means[y] + spread * rng.normal(size=(len(y), dim))
    if scale is not None:  # columns on very different scales: what standardising is for
        x = x * scale
    return x, y


@pytest.mark.parametrize("per_class,folds", [(30, 5), (8, 4)])  # 8 shots: 4 even folds of 2 texts a class
def test_tuned_probe_without_dev_equals_a_plain_logistic_regression_cv_loop(per_class, folds):
    x, y = blobs(spread=4.0, scale=np.geomspace(0.01, 100, 12), seed=1, per_class=per_class)
    test_x, test_y = blobs(spread=4.0, scale=np.geomspace(0.01, 100, 12), seed=1, per_class=60)
    probe, choice = tuned_probe(x, y, seed=0)
    best = None  # the user's loop: LogisticRegressionCV under each scaling, the best mean CV accuracy kept
    for name, make in SCALERS.items():
        lr = LogisticRegressionCV(Cs=CS, cv=StratifiedKFold(folds, shuffle=True, random_state=0), scoring="accuracy",
                                  max_iter=1000)
        fitted = make_pipeline(make(), lr).fit(x, y)
        scores = next(iter(lr.scores_.values())) if isinstance(lr.scores_, dict) else lr.scores_
        score = np.mean(scores, axis=0).max()
        if best is None or score > best[0]:
            best = (score, name, float(np.ravel(lr.C_)[0]), fitted)
    assert (choice.how, choice.scaling, choice.C) == ("cv", best[1], best[2])
    assert choice.score == pytest.approx(best[0])
    np.testing.assert_array_equal(probe.predict(test_x), best[3].predict(test_x))


def test_tuned_probe_with_dev_equals_a_plain_loop_and_beats_the_default_probe():
    x, y = blobs(n_classes=6, per_class=40, dim=24, spread=5.0, seed=2)
    dev_x, dev_y = blobs(n_classes=6, per_class=40, dim=24, spread=5.0, seed=2)
    rng = np.random.default_rng(3)
    dev_x = dev_x + 5.0 * rng.normal(size=dev_x.shape)  # same means, other noise
    test_x = x + 5.0 * rng.normal(size=x.shape)
    probe, choice = tuned_probe(x, y, (dev_x, dev_y))
    scored = [((make_pipeline(make(), LogisticRegression(C=C, max_iter=1000)).fit(x, y).predict(dev_x) == dev_y).mean(),
               name, C) for name, make in SCALERS.items() for C in CS]
    top = max(s for s, _, _ in scored)
    se = (top * (1 - top) / len(dev_y)) ** 0.5  # one standard error of the best dev accuracy
    score, name, C = next(t for t in scored if t[0] >= top - se)  # the first within it: L2 first, small C first
    assert (choice.how, choice.scaling, choice.C, choice.score) == ("dev", name, C, score)
    want = make_pipeline(SCALERS[name](), LogisticRegression(C=C, max_iter=1000)).fit(x, y).predict(test_x)
    np.testing.assert_array_equal(probe.predict(test_x), want)
    default = make_pipeline(Normalizer(), LogisticRegression(max_iter=1000)).fit(x, y)  # the old probe: C = 1, L2
    assert choice.C != 1.0 or choice.scaling != "l2"  # this data asks for another setting ...
    assert (probe.predict(dev_x) == dev_y).mean() > (default.predict(dev_x) == dev_y).mean()  # ... and it pays


def test_cross_validation_folds_hold_out_the_same_share_of_every_class():
    """Uneven folds bias the CV against regularised probes (heads.kinds.label_probe): 8 texts a class give 4
    folds of 2 texts of each class, 10 give 5 of 2; 7 (no k <= 10 but 7 divides it) 7 folds of 1."""
    for per_class, k in ((8, 4), (10, 5), (7, 7), (64, 4)):
        y = np.repeat(np.arange(20), per_class)
        folds = cv_folds(y, seed=0)
        assert folds.get_n_splits() == k
        for _, held in folds.split(np.zeros(len(y)), y):
            assert (np.bincount(y[held], minlength=20) == per_class // k).all()
    y = np.repeat(np.arange(3), [8, 8, 5])  # no k divides every count: sklearn's 5 (the smallest class's size)
    assert cv_folds(y).get_n_splits() == 5


def test_regularised_probes_are_not_penalised_by_the_folds():
    """The effect the even folds remove, against a plain sklearn loop: with 8 texts a class and 5 folds a
    strongly regularised probe's CV accuracy collapses (its intercept learns the folds' uneven class counts);
    with 4 even folds it does not."""
    x, y = blobs(n_classes=10, per_class=8, dim=16, spread=2.0, seed=5)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)

    def cv_accuracy(k):
        lr = LogisticRegressionCV(Cs=[0.1], cv=StratifiedKFold(k, shuffle=True, random_state=0), scoring="accuracy",
                                  max_iter=1000).fit(x, y)
        return float(np.mean(next(iter(lr.scores_.values()))))
    fit = (LogisticRegression(C=0.1, max_iter=1000).fit(x, y).predict(x) == y).mean()
    assert cv_accuracy(cv_folds(y).get_n_splits()) > cv_accuracy(5) + 0.1 and fit > 0.9  # 0.975 vs 0.825


def labelled_set(tmp_path, x, y, names, split):
    texts = [f"text {i}" for i in range(len(y))]
    path = tmp_path / "blobs.parquet"
    pl.DataFrame({"text": texts, "label": [names[c] for c in y], "split": split}).write_parquet(path)
    return path, MemoryStore(texts), torch.tensor(x, dtype=torch.float32)


@pytest.mark.parametrize("hierarchy", [False, True])
def test_ce_head_reaches_100_percent_on_a_tiny_separable_set(tmp_path, hierarchy):
    x, y = blobs(n_classes=4, per_class=40, dim=8, spread=0.3, seed=4)
    split = np.where(np.arange(len(y)) % 4 == 0, "test", "train")
    path, store, X = labelled_set(tmp_path, x, y, ["a.x", "a.y", "b.x", "b.y"], split)
    cfg = TrainConfig(loss="ce", hierarchy=hierarchy, epochs=30, lr=1e-2, batch_size=16, patience=30)
    task = for_training(load_task(str(path), store, "labels?label_sep=."), cfg)
    head = head_shape(HeadConfig(depth=2, hidden=16), X, "features", task, cfg)
    assert head.out_features == (4 + 2 if hierarchy else 4) and not head.residual  # classes, or tree nodes
    model, norm, run = train_one(task, X, head, cfg, progress=False)
    assert "dev_classifier_accuracy" in run.history[0]  # selected on its argmax, not on a k-NN
    res, items = evaluate_split(task, "test", embedder(model, norm(X)), (cfg.eval_energy,))
    assert res[0]["classifier_accuracy"] == 1.0 and res[0]["classifier_accuracy_level1"] == 1.0
    assert items[0]["classifier"].shape == (len(task.eval_sets["test"]),)
    assert run.history[-1]["loss"] < run.history[0]["loss"]
    ref = ((model.eval()(norm(X)[torch.as_tensor(task.eval_sets["test"].rows)])[0]).argmax(-1).numpy()
           if not hierarchy else None)  # flat: the argmax of the outputs themselves
    if ref is not None:
        np.testing.assert_array_equal(ref, task.eval_sets["test"].classes)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("classifier")
    rng = random.Random(1)
    groups = [WORDS[i::4] for i in range(4)]
    rows = [{"text": " ".join(rng.choice(groups[c]) for _ in range(5)) + f" {c}{i}", "label": f"top{c // 2}.sub{c}",
             "split": "train" if i < 12 else "test"} for c in range(4) for i in range(16)]
    pl.DataFrame(rows).write_parquet(root / "topics.parquet")
    model = tiny_bert(root / "model", layers=2)
    store = root / "store"
    r = CliRunner().invoke(main, ["featurize", "--model", str(model), "--data", str(root / "topics.parquet"),
                                  "--store", str(store), "--dtype", "float32"])
    assert r.exit_code == 0, r.output
    return root, store, model


@pytest.mark.parametrize("hierarchy", [False, True])
def test_exported_classifier_predicts_like_head_predict(world, tmp_path, hierarchy):
    from sentence_transformers import SentenceTransformer

    root, store, _ = world
    out = tmp_path / "head"
    args = ["train-head", "--store", str(store), "--data", str(root / "topics.parquet"), "--label-sep", ".",
            "--out", str(out), "--epochs", "3", "--batch-size", "8", "--hidden", "16", "--loss", "ce"]
    r = CliRunner().invoke(main, args + (["--hierarchy"] if hierarchy else []))
    assert r.exit_code == 0, r.output
    config = json.loads((out / "config.json").read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    assert config["train"]["loss"] == "ce"  # a classifier head: the ce recipe's own defaults (no dev choice: --loss)
    assert (config["train"]["normalize"], config["head"]["depth"]) == ("standardize", 2)
    assert config["train"]["solver"] == "adamw" and config["train"]["self_train"] == 0
    assert config["head"]["hidden"] == 16 and "'hidden': 1024" not in config["defaults"]  # a given setting wins
    assert metrics["primary"] == "classifier_accuracy" and len(metrics["ci"]["head"]) == 2
    assert {"probe_accuracy", "probe_C", "probe_standardize"} <= set(metrics["baseline"]) & set(metrics["head"])
    head = headstore.Head.load(out)
    assert head.is_classifier and head.classes == [f"top{c // 2}.sub{c}" for c in range(4)]
    texts = pl.read_parquet(root / "topics.parquet")["text"].to_list()
    features = headstore.Pipeline.from_head(head).features(texts)
    want = head.predict(features)
    assert head.class_scores(features).shape == (len(texts), 4) and set(want) <= set(head.classes)
    st = tmp_path / "st"
    r = CliRunner().invoke(main, ["export", "--head", str(out), "--format", "sentence-transformers", "--out", str(st)])
    assert r.exit_code == 0, r.output
    info = json.loads((st / "headstore_export.json").read_text())
    scores = SentenceTransformer(str(st), device="cpu").encode(texts, convert_to_numpy=True)
    assert scores.shape == (len(texts), 4)  # the last module gives the class scores
    np.testing.assert_array_equal(np.asarray(info["classes"])[scores.argmax(-1)], want)
    r = CliRunner().invoke(main, ["export", "--head", str(out), "--format", "safetensors", "--out", str(tmp_path / "h")])
    assert r.exit_code == 0, r.output
    np.testing.assert_array_equal(headstore.Head.load(tmp_path / "h").predict(features), want)
    with pytest.raises(ValueError, match="classifier head"):
        head.energy(features[:2], features)


def test_energy_heads_keep_their_defaults_on_labelled_texts(world, tmp_path):
    """The classifier head's own defaults (width, rate, standardised inputs) do not reach an energy head."""
    root, store, _ = world
    r = CliRunner().invoke(main, ["train-head", "--store", str(store), "--data", str(root / "topics.parquet"),
                                  "--loss", "supcon-kl", "--out", str(tmp_path / "e"), "--epochs", "1"])
    assert r.exit_code == 0, r.output
    config = json.loads((tmp_path / "e" / "config.json").read_text())
    assert (config["head"]["hidden"], config["train"]["lr"], config["train"]["normalize"]) == (512, 1e-3, "l2")
    assert config["head"]["residual"] and json.loads((tmp_path / "e" / "metrics.json").read_text())["primary"] == \
        "manhattan_knn_accuracy"


def test_grid_trains_ce_beside_energy_heads_and_its_best_head_predicts(world):
    root, store, _ = world
    grid = root / "grid.toml"
    grid.write_text('[grid]\nloss = ["ce", "supcon-kl"]\nhierarchy = [false, true]\n'
                    '[fixed]\nepochs = 2\nbatch_size = 8\nhidden = 16\n')
    r = CliRunner().invoke(main, ["grid", "--store", str(store), "--data", str(root / "topics.parquet"), "--label-sep",
                                  ".", "--grid", str(grid), "--out", str(root / "grid")])
    assert r.exit_code == 0, r.output
    frame = pl.read_parquet(root / "grid" / "results.parquet").filter(pl.col("status") == "ok")
    assert frame.height == 4
    ce = frame.filter(pl.col("loss") == "ce")
    assert set(ce["primary"]) == {"classifier_accuracy"} and ce["test_classifier_accuracy"].null_count() == 0
    assert frame["test_probe_accuracy"].null_count() == 0 and frame["test_probe_C"].is_in(CS).all()  # tuned, each
    head_id = ce["head_id"][0]
    head = headstore.Head.load(f"{root / 'grid'}#id={head_id}")
    assert head.is_classifier and len(head.predict(np.zeros((2, head.in_dim), np.float32))) == 2
    with pytest.raises(ValueError, match="energy head"):
        headstore.Head.load(f"{root / 'grid'}#id={frame.filter(pl.col('loss') == 'supcon-kl')['head_id'][0]}").predict(
            np.zeros((1, head.in_dim), np.float32))


def test_few_shot_ce_head_trains_enough_steps_and_energy_heads_keep_their_epochs():
    """A ce head on n texts per class trains about as many optimiser steps as at any other n (20 classes,
    batches of 64: >= 200), where the full-data 10 epochs would give 30 at 8 shots; energy heads unchanged."""
    from headstore.heads.kinds.labels import KIND
    full = KIND.defaults_for("ce")["epochs"]
    for shots in (8, 16, 64):
        epochs = KIND.defaults_for("ce", shots)["epochs"]
        assert epochs * math.ceil(20 * shots / 64) >= 200 and epochs >= full
        assert KIND.defaults_for("supcon-kl", shots) == KIND.defaults_for("supcon-kl") == KIND.defaults
    assert full * math.ceil(20 * 8 / 64) < 50  # what the full-data schedule gives 8 shots
    for shots, rounds in ((8, 5), (16, 5), (64, 0)):  # a linear softmax on unit-norm features fitted by lbfgs,
        few = KIND.defaults_for("ce", shots, unlabeled=True)  # self-trained up to 16 shots (dev: within one SE
        assert (few["depth"], few["normalize"], few["solver"], few["self_train"]) == (1, "l2", "lbfgs", rounds)  # 64)
        assert KIND.defaults_for("ce", shots)["self_train"] == 0  # no unlabeled texts: nothing to self-train on
        assert "solver" not in KIND.defaults_for("ce", shots, unlabeled=True, hierarchy=True)  # lbfgs: one softmax
    assert KIND.defaults_for("ce")["depth"] == 2 and "solver" not in KIND.defaults_for("ce")  # all of train: the MLP
    assert KIND.defaults_for("ce", 10_000)["epochs"] == full  # many texts per class: the full-data schedule


def test_train_head_with_shots_takes_the_few_shot_epochs_unless_given(world, tmp_path):
    from headstore.heads.kinds.labels import KIND
    root, store, _ = world
    base = ["train-head", "--store", str(store), "--data", str(root / "topics.parquet"), "--shots", "4",
            "--batch-size", "8", "--hidden", "16"]
    r = CliRunner().invoke(main, base + ["--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["train"]["epochs"] == KIND.defaults_for("ce", 4)["epochs"] > KIND.defaults["epochs"]
    assert f"'epochs': {config['train']['epochs']}" in config["defaults"]  # said where it came from
    # few-shot: a linear softmax on L2-normalised features, not the full-data 2-layer head on standardised ones
    assert (config["head"]["depth"], config["train"]["normalize"], config["head"]["residual"]) == (1, "l2", False)
    r = CliRunner().invoke(main, base + ["--epochs", "3", "--normalize", "standardize", "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    given = json.loads((tmp_path / "b" / "config.json").read_text())
    assert (given["train"]["epochs"], given["train"]["normalize"]) == (3, "standardize")  # given settings win
