"""The few-shot classifier head fitted by lbfgs (`--solver lbfgs`) and self-trained over the texts the shots leave
out (`--self-train`, heads.training.linear_fit), against plain scikit-learn loops written here."""
import json

import headstore
import numpy as np
import polars as pl
import pytest
import torch
from click.testing import CliRunner
from headstore.cli import main
from headstore.heads.kinds import for_training, load_task
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.training.linear_fit import class_weights
from headstore.heads.training.run import head_shape
from headstore.heads.training.train import train_one
from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
from sklearn.model_selection import StratifiedKFold

from .finetune_world import tiny_bert
from .label_world import MemoryStore

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # the reference loops call sklearn as a user would
CS = [0.1, 1.0, 10.0, 100.0]


def overlapping_blobs(tmp_path, n_classes=5, per_class=60, dim=10, seed=3):
    """Classes that overlap (a few-shot fit is far from perfect), 2/3 of each class train, the rest test."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(n_classes), per_class)
    x = 1.5 * rng.normal(size=(n_classes, dim))[y] + rng.normal(size=(len(y), dim))
    split = np.where(np.arange(len(y)) % 3 == 0, "test", "train")
    texts = [f"text {i}" for i in range(len(y))]
    path = tmp_path / "blobs.parquet"
    pl.DataFrame({"text": texts, "label": [f"c{c}" for c in y], "split": split}).write_parquet(path)
    return path, MemoryStore(texts), torch.tensor(x, dtype=torch.float32)


def featurized(tmp_path, data, unlabeled=None):
    """A real store of `data`'s texts (and the --unlabeled file's) under a tiny one-layer BERT."""
    model = tiny_bert(tmp_path / "model", layers=1)
    store = tmp_path / "store"
    more = ["--unlabeled", str(unlabeled)] if unlabeled else []
    r = CliRunner().invoke(main, ["featurize", "--model", str(model), "--data", str(data), *more,
                                  "--store", str(store), "--dtype", "float32"])
    assert r.exit_code == 0, r.output
    return store


def fitted_head(path, store, X, **settings):
    """(task, class probabilities of every row) of a depth-1 ce head fitted by lbfgs with `settings`."""
    cfg = TrainConfig(loss="ce", solver="lbfgs", normalize="l2", **settings)
    task = for_training(load_task(str(path), store), cfg)
    head = head_shape(HeadConfig(depth=1), X, "features", task, cfg)
    model, norm, run = train_one(task, X.clone(), head, cfg, progress=False)
    with torch.no_grad():
        proba = torch.softmax(model.eval()(norm(X))[0], -1).numpy()
    return task, proba, run


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def reference_fit(x, y, seed, C=None):
    """What a user writes: LogisticRegressionCV on even stratified folds (8 shots: 4 folds of 2), refitted."""
    if C is None:
        folds = StratifiedKFold(n_splits=4, shuffle=True, random_state=seed)
        C = float(LogisticRegressionCV(Cs=CS, cv=folds, scoring="accuracy", max_iter=1000,
                                       random_state=seed).fit(x, y).C_[0])
    return LogisticRegression(C=C, max_iter=1000, random_state=seed).fit(x, y), C


def test_lbfgs_head_is_the_cross_validated_logistic_regression(tmp_path):
    """--shots 8 without self-training: the head is scikit-learn's LogisticRegressionCV on the shots' unit-norm
    features (4 stratified folds of 2, seed 0, its own refit), the reference printed beside it, whatever --seed
    (before: a cold float32 refit at the CV's C on the seed's folds, off the reference's optimum: 20 Newsgroups at
    64 shots, seed 0, 0.6939 against the reference's 0.6949)."""
    path, store, X = overlapping_blobs(tmp_path)
    task, proba, run = fitted_head(path, store, X, shots=8, seed=2)
    rows, x = task.reference.rows, unit(X.double().numpy())
    lr = LogisticRegressionCV(Cs=CS, cv=StratifiedKFold(4, shuffle=True, random_state=0), scoring="accuracy",
                              max_iter=1000, random_state=0).fit(x[rows], task.reference.classes)
    np.testing.assert_allclose(proba, lr.predict_proba(x), atol=2e-6)
    assert run.history[0]["C"] == lr.C_[0] and len(run.history) == 1  # no self-training asked for


@pytest.mark.parametrize("seed", [0, 1])
def test_lbfgs_head_on_every_train_text_is_the_printed_reference(tmp_path, seed):
    """Labelled texts, no --shots, no self-training (the `lr` recipe): the head is scikit-learn's
    LogisticRegressionCV on its 5 stratified folds of seed 0, as the reference printed beside it, whatever --seed
    (before: a cold refit at the CV's C in float32 on the seed's folds, off the reference's optimum)."""
    path, store, X = overlapping_blobs(tmp_path, n_classes=6, per_class=120, dim=24)
    cfg = TrainConfig(loss="ce", solver="lbfgs", normalize="none", seed=seed)
    task = for_training(load_task(str(path), store), cfg)
    head = head_shape(HeadConfig(depth=1), X, "features", task, cfg)
    model, norm, run = train_one(task, X.clone(), head, cfg, progress=False)
    with torch.no_grad():
        proba = torch.softmax(model.eval()(norm(X))[0], -1).numpy()
    x, rows = X.double().numpy(), task.reference.rows
    assert np.bincount(task.reference.classes).tolist() == [72] * 6  # 80 train a class less 8 dev: 6 even folds of 12
    lr = LogisticRegressionCV(Cs=CS, cv=StratifiedKFold(6, shuffle=True, random_state=0), scoring="accuracy",
                              max_iter=1000, random_state=0).fit(x[rows], task.reference.classes)
    np.testing.assert_allclose(proba, lr.predict_proba(x), atol=2e-6)
    assert run.history[0]["C"] == lr.C_[0]


@pytest.mark.parametrize("rounds_c", [0.0, 10.0])  # 0: the shots' cross-validated C; 10: the default
def test_self_training_rounds_equal_a_plain_loop(tmp_path, rounds_c):
    """Each round: the previous fit's probabilities on the unlabeled texts (train less dev less the shots), the
    r x add most confident texts per predicted class added with that class, refitted at the rounds' C."""
    path, store, X = overlapping_blobs(tmp_path)
    task, proba, run = fitted_head(path, store, X, shots=8, seed=1, self_train=3, self_train_add=4,
                                   self_train_c=rounds_c)
    x, shots = unit(X.numpy()), task.reference
    unlabeled = np.array([r for r in task.pool.rows if r not in set(shots.rows)])
    assert len(unlabeled) == len(task.pool) - len(shots) > 0
    assert not set(unlabeled) & set(task.eval_sets["test"].rows)  # test texts are never pseudo-labelled
    lr, C = reference_fit(x[shots.rows], shots.classes, seed=1)
    C = rounds_c or C
    for r in (1, 2, 3):
        p = lr.predict_proba(x[unlabeled])
        picked = [i for c in range(5) for i in sorted(np.flatnonzero(p.argmax(1) == c),
                                                      key=lambda i: (-p[i].max(), i))[:4 * r]]
        lr = LogisticRegression(C=C, max_iter=1000, random_state=1).fit(
            np.vstack([x[shots.rows], x[unlabeled[picked]]]), np.concatenate([shots.classes, p[picked].argmax(1)]))
        assert run.history[r]["pseudo"] == len(picked)
        truth = dict(zip(task.pool.rows, task.pool.classes))
        hidden = np.array([truth[u] for u in unlabeled[picked]])
        assert run.history[r]["pseudo_accuracy"] == pytest.approx(float((hidden == p[picked].argmax(1)).mean()))
    np.testing.assert_allclose(proba, lr.predict_proba(x), atol=1e-5)


def test_a_round_C_can_be_given(tmp_path):
    path, store, X = overlapping_blobs(tmp_path)
    _, _, run = fitted_head(path, store, X, shots=8, seed=0, self_train=1, self_train_c=7.0)
    assert run.history[1]["C"] == 7.0 and run.history[0]["C"] in CS


def test_two_class_and_unseen_class_weights_give_the_fits_softmax():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 6)), np.repeat([0, 2], 20)  # class 1 has no labelled text
    fit = LogisticRegression(C=3.0).fit(x, y)
    W, b = class_weights(fit, 3)
    logits = x @ W.T + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(p[:, [0, 2]], fit.predict_proba(x), atol=1e-6)
    assert p[:, 1].max() < 1e-30  # never predicted


@pytest.mark.parametrize("settings,message", [
    ({"loss": "ce", "solver": "lbfgs", "shots": 8, "self_train": -1}, "self_train must be >= 0"),
    ({"loss": "ce", "solver": "lbfgs", "shots": 8, "self_train_add": 0}, "self_train_add must be >= 1"),
    ({"loss": "ce", "solver": "newton"}, "valid"),
])
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**settings)


@pytest.mark.parametrize("settings,message", [
    ({"loss": "supcon", "solver": "lbfgs"}, "lbfgs fits a classifier head"),
    ({"loss": "ce", "shots": 8, "self_train": 2}, "needs --solver lbfgs"),
    ({"loss": "ce", "solver": "lbfgs", "self_train": 2}, "needs unlabeled texts: --shots n"),
])
def test_inconsistent_solver_settings_are_refused_before_training(tmp_path, settings, message):
    path, store, X = overlapping_blobs(tmp_path)
    cfg = TrainConfig(**settings)  # made: the kind may still fill in solver and loss
    task = for_training(load_task(str(path), store), cfg)
    with pytest.raises(ValueError, match=message):
        train_one(task, X, head_shape(HeadConfig(depth=1), X, "features", task, cfg), cfg, progress=False)


def test_cli_few_shot_default_is_the_self_trained_lbfgs_head_and_other_shapes_are_refused(tmp_path):
    path, _, _ = overlapping_blobs(tmp_path)  # the texts "text i": a tiny BERT's features are near chance
    store = featurized(tmp_path, path)
    base = ["train-head", "--store", str(store), "--data", str(path), "--shots", "8"]
    r = CliRunner().invoke(main, base + ["--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert (config["train"]["solver"], config["train"]["self_train"], config["head"]["depth"]) == ("lbfgs", 5, 1)
    history = json.loads((tmp_path / "a" / "metrics.json").read_text())["history"]
    assert [h["epoch"] for h in history] == list(range(6)) and history[-1]["pseudo"] > 0
    head = headstore.Head.load(tmp_path / "a")  # a head like any other: predict, and the exported model agrees
    texts = pl.read_parquet(path)["text"].to_list()
    features = headstore.Pipeline.from_head(head).features(texts)
    want = head.predict(features)
    r = CliRunner().invoke(main, ["export", "--head", str(tmp_path / "a"), "--format", "sentence-transformers",
                                  "--out", str(tmp_path / "st")])
    assert r.exit_code == 0, r.output
    from sentence_transformers import SentenceTransformer
    scores = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(texts, convert_to_numpy=True)
    classes = json.loads((tmp_path / "st" / "headstore_export.json").read_text())["classes"]
    np.testing.assert_array_equal(np.asarray(classes)[scores.argmax(-1)], want)
    r = CliRunner().invoke(main, base + ["--depth", "2", "--out", str(tmp_path / "b")])
    assert r.exit_code != 0 and "--solver lbfgs fits a linear classifier head" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "b").exists()
    r = CliRunner().invoke(main, base + ["--loss", "supcon-kl", "--self-train", "2", "--out", str(tmp_path / "c")])
    assert r.exit_code != 0 and "needs --solver lbfgs" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, base[:-2] + ["--self-train", "2", "--out", str(tmp_path / "d")])  # no --shots
    assert r.exit_code != 0 and "needs unlabeled texts" in r.output and not (tmp_path / "d").exists()


def test_grid_trains_lbfgs_heads_with_and_without_self_training_and_train_head_gives_the_same(tmp_path):
    """A grid's lbfgs heads (one stack per seed) equal train-head's with the same settings, row for row."""
    path, _, _ = overlapping_blobs(tmp_path)
    store = featurized(tmp_path, path)
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nself_train = [0, 2]\nseed = [0, 1]\n[fixed]\nloss = "ce"\nsolver = "lbfgs"\n'
                    'depth = 1\nshots = 8\nself_train_add = 3\n')
    r = CliRunner().invoke(main, ["grid", "--store", str(store), "--data", str(path), "--grid", str(grid),
                                  "--out", str(tmp_path / "grid")])
    assert r.exit_code == 0, r.output
    frame = pl.read_parquet(tmp_path / "grid" / "results.parquet").filter(pl.col("status") == "ok")
    assert frame.height == 4
    row = frame.filter((pl.col("self_train") == 2) & (pl.col("seed") == 1))
    r = CliRunner().invoke(main, ["train-head", "--store", str(store), "--data", str(path), "--shots", "8",
                                  "--seed", "1", "--self-train", "2", "--self-train-add", "3",
                                  "--out", str(tmp_path / "one")])
    assert r.exit_code == 0, r.output
    metrics = json.loads((tmp_path / "one" / "metrics.json").read_text())
    assert row["test_classifier_accuracy"][0] == pytest.approx(metrics["head"]["classifier_accuracy"], abs=1e-9)


def test_self_training_with_no_unlabeled_text_left_is_said_and_fits_the_shots(tmp_path, capsys):
    path, store, X = overlapping_blobs(tmp_path)
    _, _, run = fitted_head(path, store, X, shots=500, seed=0, self_train=3)
    assert len(run.history) == 1 and "no unlabeled texts" in capsys.readouterr().err


def labelled_and_unlabeled(tmp_path, labelled_per_class=6):
    """The blobs' first `labelled_per_class` train texts of each class as a labelled table (the test texts kept),
    the other train texts as an --unlabeled file (no labels)."""
    path, store, X = overlapping_blobs(tmp_path)
    frame = pl.read_parquet(path).with_row_index("i")
    train = frame.filter(pl.col("split") == "train")
    # a list: polars deprecates is_in with a Series of the same dtype
    keep = train.group_by("label", maintain_order=True).head(labelled_per_class)["i"].to_list()
    table = frame.filter(pl.col("i").is_in(keep) | (pl.col("split") == "test")).drop("i")
    table.write_parquet(tmp_path / "labelled.parquet")
    rest = train.filter(~pl.col("i").is_in(keep))["text"].to_list()
    (tmp_path / "unlabeled.txt").write_text("\n".join(rest) + "\n")
    return tmp_path / "labelled.parquet", tmp_path / "unlabeled.txt", store, X, rest


def test_unlabeled_texts_are_what_a_labelled_table_self_trains_on(tmp_path):
    """A small labelled table and an --unlabeled file: the rounds pseudo-label exactly the file's texts (a plain
    loop over them gives the same head), and no hidden label is claimed for them."""
    table, unlabeled_file, store, X, rest = labelled_and_unlabeled(tmp_path)
    cfg = TrainConfig(loss="ce", solver="lbfgs", normalize="l2", self_train=2, self_train_add=5, self_train_c=10.0)
    task = for_training(load_task(str(table), store, unlabeled=(str(unlabeled_file),)), cfg)
    model, norm, run = train_one(task, X.clone(), head_shape(HeadConfig(depth=1), X, "features", task, cfg), cfg,
                                 progress=False)
    x, labelled = unit(X.numpy()), task.reference
    u = np.array([store.index[i] for i in store.row_ids(rest)])
    folds = StratifiedKFold(n_splits=even_k(labelled.classes), shuffle=True, random_state=0)
    C0 = float(LogisticRegressionCV(Cs=CS, cv=folds, scoring="accuracy", max_iter=1000, random_state=0)
               .fit(x[labelled.rows], labelled.classes).C_[0])
    lr = LogisticRegression(C=C0, max_iter=1000, random_state=0).fit(x[labelled.rows], labelled.classes)
    for r in (1, 2):
        p = lr.predict_proba(x[u])
        picked = [i for c in range(5) for i in sorted(np.flatnonzero(p.argmax(1) == c),
                                                      key=lambda i: (-p[i].max(), i))[:5 * r]]
        lr = LogisticRegression(C=10.0, max_iter=1000, random_state=0).fit(
            np.vstack([x[labelled.rows], x[u[picked]]]), np.concatenate([labelled.classes, p[picked].argmax(1)]))
        assert run.history[r]["pseudo"] == len(picked) and "pseudo_accuracy" not in run.history[r]
    with torch.no_grad():
        np.testing.assert_allclose(torch.softmax(model.eval()(norm(X))[0], -1).numpy(), lr.predict_proba(x), atol=1e-5)


def even_k(y):
    """The folds heads.kinds.label_probe takes: the k nearest 5 that divides every class's count."""
    counts = np.bincount(y)
    return min((k for k in range(2, 11) if not (counts % k).any()), key=lambda k: (abs(k - 5), -k))


def test_cli_small_labelled_table_with_unlabeled_texts_self_trains_by_default(tmp_path):
    table, unlabeled_file, _, _, rest = labelled_and_unlabeled(tmp_path)
    store = featurized(tmp_path, table, unlabeled_file)
    r = CliRunner().invoke(main, ["train-head", "--store", str(store), "--data", str(table), "--unlabeled",
                                  str(unlabeled_file), "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert (config["train"]["solver"], config["train"]["self_train"]) == ("lbfgs", 5)  # few-shot table + texts
    recipe = json.loads((tmp_path / "a" / "metrics.json").read_text())["recipe"]  # (label_recipes: too small a dev)
    assert recipe["chosen"] == "self-train" and "at most 16 train texts a class" in recipe["why"]
    history = json.loads((tmp_path / "a" / "metrics.json").read_text())["history"]
    assert history[1]["pseudo"] > 0 and history[-1]["pseudo"] <= len(rest)
    r = CliRunner().invoke(main, ["train-head", "--store", str(store), "--data", str(table),
                                  "--out", str(tmp_path / "b")])  # no unlabeled texts: the labelled fit alone
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "b" / "config.json").read_text())["train"]["self_train"] == 0


def test_grid_self_trains_over_unlabeled_texts_as_train_head_does(tmp_path):
    table, unlabeled_file, _, _, _ = labelled_and_unlabeled(tmp_path)
    store = featurized(tmp_path, table, unlabeled_file)
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nself_train = [0, 2]\n[fixed]\nloss = "ce"\nsolver = "lbfgs"\ndepth = 1\n'
                    'self_train_add = 3\n')
    data = ["--store", str(store), "--data", str(table), "--unlabeled", str(unlabeled_file)]
    r = CliRunner().invoke(main, ["grid", *data, "--grid", str(grid), "--out", str(tmp_path / "grid")])
    assert r.exit_code == 0, r.output
    frame = pl.read_parquet(tmp_path / "grid" / "results.parquet").filter(pl.col("status") == "ok")
    assert frame.height == 2
    r = CliRunner().invoke(main, ["train-head", *data, "--solver", "lbfgs", "--depth", "1", "--self-train", "2",
                                  "--self-train-add", "3", "--normalize", "l2", "--out", str(tmp_path / "one")])
    assert r.exit_code == 0, r.output
    metrics = json.loads((tmp_path / "one" / "metrics.json").read_text())
    row = frame.filter(pl.col("self_train") == 2)
    assert row["test_classifier_accuracy"][0] == pytest.approx(metrics["head"]["classifier_accuracy"], abs=1e-9)
    assert "pseudo_labels" in metrics["unlabeled"]["roles"]
