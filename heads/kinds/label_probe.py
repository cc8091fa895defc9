"""The linear probe of labelled texts, tuned: a logistic regression whose C and input scaling are chosen.

What a user with frozen embeddings tries first is scikit-learn's `LogisticRegressionCV`; a probe with the
default C = 1 on L2-normalised features is far weaker than that (MiniLM on 20 Newsgroups: C = 1 is a strong
penalty on unit-norm features). So every probe here is tuned, the same way for the stored features (the
frozen baseline) and for a head's outputs:
- with a dev split: each scaling in `SCALINGS` x each C in `PROBE_CS` is fitted on the labelled texts and
  scored on dev; the first candidate in the order of the loops (L2 before standardising, the smaller C
  first: the more regularised probe) whose dev accuracy is within one standard error of the best wins (the
  one-standard-error rule, Hastie, Tibshirani & Friedman, ESL 7.10; SE = sqrt(a (1 - a) / n_dev) of the best
  accuracy a). Why: a difference dev cannot resolve is noise, and the larger C it would pick fits the
  training texts' particulars (20 Newsgroups: C = 10 beat C = 1 on dev by 3 texts of 1,130, 0.8106 vs
  0.8080, and lost on the later-dated test posts by 1.7 points, 0.7339 vs 0.7512);
- without one (few-shot: n texts per class and no dev): for each scaling, `LogisticRegressionCV` over the
  same Cs with stratified k-fold cross-validation on the labelled texts, k from `cv_folds`: a number of
  folds that every class's count divides (nearest `CV_FOLDS`) so that each fold holds out the same share
  of every class. Why: with 8 texts per class and 5 folds some classes lose 2 texts to a fold and others 1,
  the intercept learns the fold's class counts, and these are anti-correlated with what the fold holds out:
  the more regularised probes, which lean on the intercept, then score far too low (20 Newsgroups, 8 shots:
  C = 0.1 on L2 inputs cross-validated at 0.21 while its dev accuracy is 0.62; with 4 even folds 0.57), and
  the CV picked C = 100 on standardised inputs, 2.4 points below C = 1 on test. The scaling with the best
  mean cross-validated accuracy wins (ties: L2) and its refitted model predicts; with a single text in some
  class there is nothing to cross-validate and sklearn's default (C = 1 on L2-normalised inputs) is fitted,
  said as how = "default".
The choice is reported (`ProbeChoice`: C, scaling, how, its dev or CV accuracy); metrics.json carries it as
`probe_C` and `probe_standardize`.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import Normalizer, StandardScaler

PROBE_CS = (0.1, 1.0, 10.0, 100.0)  # the grid: C = 1 (sklearn's default) with a decade either side and 100
SCALINGS = ("l2", "standardize")  # unit-norm rows (SetFit's / the old probe's input), or standardised columns
CV_FOLDS = 5  # sklearn's default k for LogisticRegressionCV; `cv_folds` takes the nearest k that gives even folds
MAX_EVEN_FOLDS = 10  # beyond this many folds (a prime count of texts per class) CV_FOLDS uneven folds are used
PROBE_MAX_ITER = 1000  # lbfgs iterations: the default 100 stops short on 10k x 384 features at C >= 10


@dataclass(frozen=True)
class ProbeChoice:
    C: float
    scaling: str  # one of SCALINGS
    how: str  # "dev" (chosen on the dev split) or "cv" (cross-validated on the labelled texts)
    score: float  # the winner's dev accuracy, or its mean cross-validated accuracy

    def metrics(self) -> dict[str, float]:
        """What metrics.json reports of the choice (floats, as every metric)."""
        return {"probe_C": float(self.C), "probe_standardize": float(self.scaling == "standardize")}


def scaler(scaling: str):
    if scaling not in SCALINGS:
        raise ValueError(f"probe scaling {scaling!r}; valid: {list(SCALINGS)}")
    return Normalizer() if scaling == "l2" else StandardScaler()


def plain_probe(C: float, scaling: str, seed: int = 0) -> Pipeline:
    """The probe at one setting: the scaling, then sklearn's LogisticRegression with that C."""
    return make_pipeline(scaler(scaling), LogisticRegression(C=C, max_iter=PROBE_MAX_ITER, random_state=seed))


def smallest_class(y: np.ndarray) -> int:
    return int(np.bincount(np.unique(y, return_inverse=True)[1]).min())


def even_folds(counts: np.ndarray) -> int:
    """The k for cross-validation on classes of these text counts: among the k in [2, MAX_EVEN_FOLDS] that
    divide every count (each fold holds out the same share of every class: module doc), the nearest to
    CV_FOLDS (ties: the larger); CV_FOLDS, or the smallest count when below, when none divides them all."""
    smallest = int(counts.min())
    even = [k for k in range(2, min(smallest, MAX_EVEN_FOLDS) + 1) if not (counts % k).any()]
    if not even:
        return min(CV_FOLDS, smallest)
    return min(even, key=lambda k: (abs(k - CV_FOLDS), -k))


def cv_folds(y: np.ndarray, seed: int = 0) -> StratifiedKFold:
    """Stratified k-fold on the labelled texts: k = even_folds of the class counts when every class has >= 2
    texts; with a one-text class (a long-tailed table: TREC's fine question classes) CV_FOLDS folds (fewer when
    no class has that many), the one-text classes trained on in every fold (scikit-learn's own way with
    `cv=5`, its warning silenced); at least one class needs 2 texts."""
    counts = np.bincount(np.unique(y, return_inverse=True)[1])
    assert counts.max() >= 2, "cross-validation needs two texts of some class"
    k = even_folds(counts) if counts.min() >= 2 else min(CV_FOLDS, int(counts.max()))
    return StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)


def can_cross_validate(y: np.ndarray) -> bool:
    """Some class has two labelled texts (one can be held out of a fold)."""
    return int(np.bincount(np.unique(y, return_inverse=True)[1]).max()) >= 2


def tune_on_dev(x: np.ndarray, y: np.ndarray, dev_x: np.ndarray, dev_y: np.ndarray,
                seed: int = 0) -> tuple[Pipeline, ProbeChoice]:
    """(the fitted winner, its choice): every scaling x C fitted on (x, y) and scored on dev; the first within
    one standard error of the best dev accuracy kept (module doc)."""
    fitted = []
    for scaling in SCALINGS:
        for C in PROBE_CS:
            probe = plain_probe(C, scaling, seed).fit(x, y)
            fitted.append((probe, ProbeChoice(C, scaling, "dev", float((probe.predict(dev_x) == dev_y).mean()))))
    best = max(choice.score for _, choice in fitted)
    return next(f for f in fitted if f[1].score >= best - standard_error(best, len(dev_y)))


def standard_error(accuracy: float, n: int) -> float:
    """The binomial standard error of an accuracy measured on n texts."""
    return float(np.sqrt(accuracy * (1.0 - accuracy) / n))


def tune_by_cv(x: np.ndarray, y: np.ndarray, seed: int = 0) -> tuple[Pipeline, ProbeChoice]:
    """(the fitted winner, its choice): LogisticRegressionCV per scaling, the best mean CV accuracy kept."""
    best = None
    for scaling in SCALINGS:
        probe = cv_probe(scaling, y, seed)
        with warnings.catch_warnings():  # sklearn 1.8+ announces changes of defaults this call does not rely on
            warnings.simplefilter("ignore", FutureWarning)
            warnings.filterwarnings("ignore", message="The least populated class")
            probe.fit(x, y)
        lr = probe[-1]
        scores = next(iter(lr.scores_.values())) if isinstance(lr.scores_, dict) else lr.scores_  # (folds, ..., Cs)
        score = float(np.mean(scores, axis=0).max())
        if best is None or score > best[1].score:
            best = (probe, ProbeChoice(float(np.ravel(lr.C_)[0]), scaling, "cv", score))
    return best


def cv_probe(scaling: str, y: np.ndarray, seed: int = 0) -> Pipeline:
    """The scaling, then `cv_logistic`."""
    return make_pipeline(scaler(scaling), cv_logistic(y, seed))


def cv_logistic(y: np.ndarray, seed: int = 0) -> LogisticRegressionCV:
    """LogisticRegressionCV over PROBE_CS (accuracy, stratified folds of `cv_folds`) for labels `y`."""
    return LogisticRegressionCV(Cs=list(PROBE_CS), cv=cv_folds(y, seed), scoring="accuracy",
                                max_iter=PROBE_MAX_ITER, random_state=seed)


def fit_cv_logistic(x: np.ndarray, y: np.ndarray, seed: int = 0) -> LogisticRegressionCV:
    """`cv_logistic` fitted on (x, y) (refit at the chosen C on all of them), sklearn's warnings about a
    one-text class and its changing defaults silenced (cv_folds says why the first is expected)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", message="The least populated class")
        return cv_logistic(y, seed).fit(x, y)


def tuned_probe(x: np.ndarray, y: np.ndarray, dev: tuple[np.ndarray, np.ndarray] | None = None,
                seed: int = 0) -> tuple[Pipeline, ProbeChoice]:
    """The tuned probe fitted on (x, y): chosen on `dev` = (dev_x, dev_y) when given, else by CV (module doc)."""
    if dev is not None and len(dev[1]):
        return tune_on_dev(x, y, dev[0], dev[1], seed)
    if not can_cross_validate(y):  # one text of every class: no fold can hold one out
        return plain_probe(1.0, "l2", seed).fit(x, y), ProbeChoice(1.0, "l2", "default", float("nan"))
    return tune_by_cv(x, y, seed)
