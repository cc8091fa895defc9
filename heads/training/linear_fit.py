"""A linear classifier head fitted to its optimum (`--solver lbfgs`), and self-training over unlabeled texts.

A depth-1 `ce` head is a multinomial logistic regression: softmax(W x + b) of the normalised features. With a
few labelled texts per class its AdamW epochs stop short of the optimum the user's own `LogisticRegressionCV`
reaches (20 Newsgroups dev, 8 shots: 0.627 vs 0.634), so `lbfgs` fits it as scikit-learn's
`LogisticRegression` does: C (the inverse L2 penalty) chosen by `LogisticRegressionCV` over the probe's grid on
the labelled texts (stratified even folds, heads.kinds.label_probe), then the weights copied into the head. The
head is then a ce head like any other (predict, export, eval); without self-training it *is* the tuned probe on
the head's normalisation (cfg.normalize). Label smoothing, lr, epochs and batches do not apply.

Self-training (`--self-train R`, Yarowsky 1995; Lee 2013's pseudo-labels): the unlabeled texts are the train
texts the shots leave out (their labels hidden, never read to train) and the `--unlabeled` texts. Round r
(1..R) pseudo-labels them with the previous round's head and refits, at C = `self_train_c` (0: the shots'
cross-validated C), on the labelled texts plus, for every class, the r x `self_train_add` texts the head is most confident it predicts as that class (fewer where fewer are predicted
as it). Each round's history says how many texts it added and how many of them carry the label the shots hid
(`pseudo_accuracy` over `pseudo_with_hidden_label` texts: a diagnostic for the benchmark; `--unlabeled` texts
have no label to compare).
"""
from __future__ import annotations

import time

import numpy as np
import torch
from headstore.data.progress import progress_write
from headstore.heads.kinds.label_probe import (
    PROBE_MAX_ITER,
    can_cross_validate,
    fit_cv_logistic,
)
from headstore.heads.network.model import StackedMLP
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.training.batches import prepare_data
from headstore.heads.training.tracker import HeadRun
from sklearn.linear_model import LogisticRegression

DEFAULT_C = 1.0  # sklearn's default, where a class has one labelled text and nothing can be cross-validated


def fit_linear_stack(task, features: torch.Tensor, head_cfg: HeadConfig, configs: list[TrainConfig],
                     in_place: bool = False):
    """(model, normaliser, runs) of len(configs) linear classifier heads fitted by lbfgs (module doc); the
    same contract as heads.training.train.train_stack (`in_place`: `features` hold the head's inputs after)."""
    cfg0 = configs[0]
    if head_cfg.depth != 1 or head_cfg.mix != 1 or head_cfg.residual:
        raise ValueError(f"--solver lbfgs fits a linear classifier head: needs --depth 1 and one stored array, "
                         f"not residual (got depth {head_cfg.depth}, mix {head_cfg.mix}); use --solver adamw")
    if cfg0.hierarchy:
        raise ValueError("--solver lbfgs fits one softmax over the classes; --hierarchy needs --solver adamw")
    data = prepare_data(task, features, cfg0.loss, cfg0.normalize, in_place=in_place)
    as_reference = not cfg0.self_train  # no rounds (with or without --shots): the printed reference
    if as_reference and task.shots:
        progress_write(f"--shots {task.shots} without self-training: the head is " + (
            "scikit-learn's LogisticRegressionCV on the shots, the reference printed below"
            if can_cross_validate(task.reference.classes) else
            f"scikit-learn's LogisticRegression at C = {DEFAULT_C} (one text a class: nothing to cross-validate, "
            "no reference printed)"))
    X = data.X.detach().cpu().numpy().astype(np.float64 if as_reference else np.float32)  # (N, D) the head's inputs
    labelled, n_classes = task.reference, head_cfg.out_features
    unlabeled, hidden = unlabeled_texts(task) if cfg0.self_train else (np.empty(0, np.int64), np.empty(0, np.int64))
    if cfg0.self_train and not len(unlabeled):  # --shots at least every class's count: nothing left unlabeled
        progress_write(f"note: --self-train {cfg0.self_train}: no unlabeled texts (the {len(labelled)} shots are "
                       "every train text), so the head is the shots' fit alone")
    model = StackedMLP(len(configs), head_cfg, seeds=[c.seed for c in configs])
    runs = []
    for h, cfg in enumerate(configs):
        t0 = time.perf_counter()
        fitted, history = (reference_fitted(X[labelled.rows], labelled.classes) if as_reference
                           else self_trained(X, labelled.rows, labelled.classes, unlabeled, hidden, cfg))
        weight, bias = class_weights(fitted, n_classes)
        with torch.no_grad():
            model.weights[0][h].copy_(torch.as_tensor(weight.T))  # (D, C)
            model.biases[0][h].copy_(torch.as_tensor(bias))  # (C,)
        runs.append(HeadRun(config=cfg, best_epoch=len(history) - 1, history=history,  # the last round's fit
                            seconds=time.perf_counter() - t0))
    return model.to(data.X.device), data.norm, runs


def unlabeled_texts(task) -> tuple[np.ndarray, np.ndarray]:
    """(rows, hidden classes) of the texts a self-trained head pseudo-labels: with --shots, the train texts the
    shots leave out (dev excluded; their classes known to the benchmark, never trained on), then the
    --unlabeled texts not among them (class -1: unknown). None at all (every train text labelled, no
    --unlabeled): a ValueError saying where unlabeled texts come from."""
    labelled = task.reference
    left = task.pool.subset(np.flatnonzero(~np.isin(task.pool.rows, labelled.rows))) if task.shots else None
    rows = [left.rows] if left is not None else []
    hidden = [left.classes] if left is not None else []
    if task.unlabeled is not None:
        extra = task.unlabeled.rows[~np.isin(task.unlabeled.rows, np.concatenate([labelled.rows, *rows]))]
        rows.append(extra)
        hidden.append(np.full(len(extra), -1, dtype=np.int64))
    if not rows:
        raise ValueError("--self-train needs unlabeled texts: --shots n (the train texts it leaves out, labels "
                         "hidden) or --unlabeled FILE (texts in the store: cli featurize --unlabeled FILE)")
    return np.concatenate(rows).astype(np.int64), np.concatenate(hidden).astype(np.int64)


def reference_fitted(x: np.ndarray, y: np.ndarray) -> tuple[LogisticRegression, list[dict]]:
    """Labelled texts without self-training (the `lr` recipe; --shots n without rounds): scikit-learn's
    LogisticRegressionCV as the reference beside the head fits it (heads.training.label_recipes.reference_lr:
    float64 inputs, its fixed folds, its own refit), so the head *is* that reference. A cold refit at the same C in
    float32 (what self-training's rounds do) stops elsewhere on a slow optimum: 3-6 of 1,000 test predictions
    apart on 20ng-skewed; 20 Newsgroups at 64 shots 0.6939 against the reference's 0.6949."""
    fitted = fit_cv_logistic(x, y) if can_cross_validate(y) else fit_logistic(x, y, DEFAULT_C, 0)
    C = float(np.ravel(fitted.C_)[0]) if hasattr(fitted, "C_") else DEFAULT_C
    return fitted, [{"epoch": 0, "loss": log_loss(fitted, x, y), "C": C, "pseudo": 0}]


def chosen_C(x: np.ndarray, y: np.ndarray, seed: int) -> float:
    """C of the labelled texts' LogisticRegressionCV over PROBE_CS (DEFAULT_C when every class has one text:
    nothing to hold out; a one-text class among larger ones is trained on in every fold, label_probe.cv_folds)."""
    if not can_cross_validate(y):
        return DEFAULT_C
    return float(np.ravel(fit_cv_logistic(x, y, seed).C_)[0])


def self_trained(X: np.ndarray, rows: np.ndarray, classes: np.ndarray, unlabeled_rows: np.ndarray,
                 hidden_classes: np.ndarray, cfg: TrainConfig) -> tuple[LogisticRegression, list[dict]]:
    """The logistic regression on the labelled rows, then cfg.self_train rounds over the unlabeled rows (module
    doc); one history entry per round (round 0: the labelled texts alone)."""
    C = chosen_C(X[rows], classes, cfg.seed)
    fitted = fit_logistic(X[rows], classes, C, cfg.seed)
    history = [{"epoch": 0, "loss": log_loss(fitted, X[rows], classes), "C": C, "pseudo": 0}]
    C = cfg.self_train_c or C  # the rounds' C
    for r in range(1, cfg.self_train + 1 if len(unlabeled_rows) else 1):  # none: every train text is a shot
        proba = fitted.predict_proba(X[unlabeled_rows])  # (U, K) over fitted.classes_
        picked, labels = most_confident(proba, fitted.classes_, r * cfg.self_train_add)
        x = np.concatenate([X[rows], X[unlabeled_rows[picked]]])
        y = np.concatenate([classes, labels])
        fitted = fit_logistic(x, y, C, cfg.seed)
        known = hidden_classes[picked] >= 0  # texts whose label the benchmark hid (not --unlabeled ones)
        history.append({"epoch": r, "loss": log_loss(fitted, x, y), "C": C, "pseudo": len(picked),
                        **({"pseudo_accuracy": float((labels[known] == hidden_classes[picked][known]).mean()),
                            "pseudo_with_hidden_label": int(known.sum())} if known.any() else {})})
    return fitted, history


def fit_logistic(x: np.ndarray, y: np.ndarray, C: float, seed: int) -> LogisticRegression:
    return LogisticRegression(C=C, max_iter=PROBE_MAX_ITER, random_state=seed).fit(x, y)


def log_loss(fitted: LogisticRegression, x: np.ndarray, y: np.ndarray) -> float:
    """Mean cross-entropy of the fit on its own training texts (the history's "loss")."""
    proba = fitted.predict_proba(x)
    column = np.searchsorted(fitted.classes_, y)
    return float(-np.log(np.clip(proba[np.arange(len(y)), column], 1e-12, None)).mean())


def most_confident(proba: np.ndarray, classes: np.ndarray, per_class: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices into the unlabeled texts, their predicted classes): for each class, the `per_class` texts
    predicted as it with the highest probability (ties: the earlier text), classes in order."""
    predicted, confidence = proba.argmax(1), proba.max(1)
    picked = []
    for k in range(len(classes)):
        members = np.flatnonzero(predicted == k)
        picked.append(members[np.argsort(-confidence[members], kind="stable")[:per_class]])
    idx = np.concatenate(picked).astype(np.int64)
    return idx, classes[predicted[idx]]


def class_weights(fitted: LogisticRegression, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(W (C, D), b (C,)) of the head's layer giving the fit's softmax over all `n_classes` classes: a class the
    fit never saw (no labelled text) gets zero weights and a bias far below the others (never predicted); a
    two-class fit's single logit w x + b becomes the logits (0, w x + b), the same softmax."""
    coef, intercept = fitted.coef_, fitted.intercept_
    if len(fitted.classes_) == 2:
        coef, intercept = np.vstack([np.zeros_like(coef), coef]), np.concatenate([[0.0], intercept])
    W = np.zeros((n_classes, coef.shape[1]), dtype=np.float32)
    b = np.full(n_classes, float(intercept.min()) - 1e4, dtype=np.float32)
    W[fitted.classes_], b[fitted.classes_] = coef, intercept
    return W, b

