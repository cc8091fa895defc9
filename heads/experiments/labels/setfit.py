"""`cli setfit-compare`: SetFit beside headstore on the same few-shot splits, seeds and test texts.

For each shot count n and seed s, the n-per-class sample is `heads.kinds.labels.few_shot_indices`
(the one `cli grid` uses), and every method is scored on the same test texts (the whole test split,
or a fixed stratified sample of `test_per_class` per class drawn with seed 0). Methods:
- `frozen probe (tuned LR)`: headstore's probe on the stored (frozen MiniLM) features: a logistic regression
  whose C and scaling are chosen by cross-validation on the shots (heads.kinds.label_probe), what a user
  trying `LogisticRegressionCV` first gets;
- `head ce`: a classifier head (heads.scoring.losses.ce) on the stored features of the n-per-class texts, its
  argmax; `head <loss> + probe (tuned LR)` and `head <loss> k-NN` for an energy head: the tuned probe on its
  outputs / k-NN under its energy. Every head trains with train-head's defaults for labelled texts (the kind's
  `defaults`), no dev: the last epoch;
- `SetFit (a) frozen body + LR`: SetFit's model with the body left as it is and its default head
  (sklearn `LogisticRegression`) fitted on the body's embeddings;
- `SetFit (b) contrastive body`: SetFit's `Trainer` with default `TrainingArguments` (one epoch of
  contrastive body fine-tuning on generated pairs, then the head), optionally capped at
  `setfit_max_steps` (reported, with the default epoch's step count).
SetFit loads the local MiniLM directory (`featurize.encoder.model.resolve_model`), never the Hub
(HF_HUB_OFFLINE is set). Seconds are wall time on this machine, measured in one run: headstore's
exclude featurization (done once for every head, seed and shot count; the `featurize_note` gives the
encoding time of the test texts, which SetFit (a) pays too); SetFit (a)'s body is frozen, so its
test embeddings are computed once, timed, and that time is added to every (a) run.

Outputs: `runs.parquet` (one row per method, shots, seed, each with `made_of`: the key of the store, texts and
settings it was made from, the recipe versions and SetFit's version; a rerun skips the finished rows of its own key and refuses rows of another),
`setfit.md` / `setfit.json` (mean ± std and 95% t-interval over seeds per method and shot count).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import polars as pl

from headstore.data.files import (atomic_write_json, atomic_write_parquet, atomic_write_text,
                                  read_parquet_or_explain)
from headstore.data.keys import library_version, recipe, resolved
from headstore.heads.experiments.grid.summary import mean_std_ci


@dataclass(frozen=True)
class SetFitCompareConfig:
    data: str  # labelled dataset (20 Newsgroups)
    store: str  # its texts' features under `model`
    data_format: str | None = None  # labels?text_column=body for 20 Newsgroups
    shots: tuple[int, ...] = (8,)  # texts per class; SetFit's body fine-tuning cost grows with n^2 pairs
    seeds: tuple[int, ...] = (0, 1, 2)
    losses: tuple[str, ...] = ("ce", "supcon-kl")  # headstore heads: the classifier, the best energy head
    test_per_class: int | None = None  # None: the whole test split
    setfit_body: bool = True  # run (b), contrastive fine-tuning of the body
    setfit_max_steps: int | None = None  # None: SetFit's default (one epoch of generated pairs)
    model: str = "minilm"


def _task(cfg: SetFitCompareConfig):
    from headstore.featurize.store.reader import FeatureStore
    from headstore.heads.kinds import load_task
    from headstore.heads.kinds.labels import few_shot_indices

    store = FeatureStore.open(cfg.store)
    task = load_task(cfg.data, store, cfg.data_format)
    if task.kind != "labels":
        raise ValueError(f"{cfg.data}: setfit-compare needs labelled texts (--format labels), got {task.kind!r}")
    test = task.eval_sets["test"]
    if cfg.test_per_class:
        test = test.subset(few_shot_indices(test.classes, cfg.test_per_class, 0))
    task = dataclasses.replace(task, eval_sets={**task.eval_sets, "test": test})
    return store, task


FROZEN = "frozen probe (tuned LR)"


def _headstore_runs(cfg, store, task, shots: int, seed: int, done: set) -> list[dict]:
    from headstore.heads.evaluation.evaluate import embedder, evaluate_split
    from headstore.heads.kinds import for_training
    from headstore.heads.network.features import load_features
    from headstore.heads.settings.config import TrainConfig

    X = load_features(store)
    rows = []
    if (FROZEN, shots, seed) not in done:
        t0 = time.perf_counter()
        base, _ = evaluate_split(for_training(task, TrainConfig(shots=shots, seed=seed)), "test",
                                 embedder(None, X), ())
        rows.append({"method": FROZEN, "shots": shots, "seed": seed, "accuracy": base[0]["probe_accuracy"],
                     "macro_f1": base[0]["probe_macro_f1"], "seconds": time.perf_counter() - t0,
                     "probe_C": base[0]["probe_C"]})
    for loss in cfg.losses:
        if all((m, shots, seed) in done for m in _methods(loss)):
            continue
        rows += _head_rows(task, X, loss, shots, seed)
    return rows


def _methods(loss: str) -> list[str]:
    from headstore.heads.scoring.losses import LOSSES

    if LOSSES[loss].outputs == "classes":
        return [f"head {loss}"]
    return [f"head {loss} + probe (tuned LR)", f"head {loss} k-NN"]


def _head_rows(task, X, loss: str, shots: int, seed: int) -> list[dict]:
    """One head of `loss` trained on the shots with train-head's defaults for labelled texts; its rows."""
    from headstore.heads.evaluation.evaluate import embedder, evaluate_split
    from headstore.heads.kinds import for_training
    from headstore.heads.settings.config import KIND_DEPENDENT, HeadConfig, TrainConfig
    from headstore.heads.training.run import defaults_for_kind, head_shape
    from headstore.heads.training.train import train_stack

    unset = tuple(k for k in KIND_DEPENDENT if k != "loss")  # train-head's defaults for labelled texts, given the loss
    head, train, _ = defaults_for_kind(task, HeadConfig(), TrainConfig(loss=loss, shots=shots, seed=seed), unset)
    stask = for_training(task, train)
    head = head_shape(head, X, "features", stask, train)
    t0 = time.perf_counter()
    model, norm, _ = train_stack(stask, X, head, [train], progress=False)
    t1 = time.perf_counter()
    res, _ = evaluate_split(stask, "test", embedder(model, norm(X)), (train.eval_energy,))
    t2 = time.perf_counter()
    r, common = res[0], {"shots": shots, "seed": seed, "seconds": t2 - t0, "train_seconds": t1 - t0}
    keys = {m: ("classifier" if m == f"head {loss}" else "probe" if "probe" in m else
                next(k for k in r if k.endswith("_knn_accuracy"))[:-len("_accuracy")]) for m in _methods(loss)}
    return [{"method": m, "accuracy": r[f"{k}_accuracy"], "macro_f1": r[f"{k}_macro_f1"], **common}
            for m, k in keys.items()]


class _SetFit:
    """SetFit on the local MiniLM directory; (a) caches the frozen body's test embeddings."""

    def __init__(self, cfg: SetFitCompareConfig, test_texts: list[str], test_classes: np.ndarray, work_dir: Path):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the local directory only: never the Hub
        try:
            import setfit  # noqa: F401
        except ImportError:
            raise ImportError("SetFit is an optional extra: python3 -m pip install 'setfit==1.2.0' "
                              "(or the [setfit] extra)") from None
        from headstore.featurize.encoder.model import resolve_model

        self.cfg, self.model_dir = cfg, str(resolve_model(cfg.model))
        self.test_texts, self.test_classes, self.work_dir = test_texts, test_classes, work_dir
        self._test_embeddings, self._test_seconds = None, 0.0

    def _load(self):
        from setfit import SetFitModel

        return SetFitModel.from_pretrained(self.model_dir, local_files_only=True)

    def frozen(self, texts, labels, seed: int) -> tuple[np.ndarray, float]:
        """(a): predictions and seconds (its share of the one-off test encoding included)."""
        model = self._load()
        if self._test_embeddings is None:
            t0 = time.perf_counter()
            self._test_embeddings = np.asarray(model.encode(self.test_texts))
            self._test_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.model_head.set_params(random_state=seed)
        model.model_head.fit(np.asarray(model.encode(texts)), labels)
        pred = model.model_head.predict(self._test_embeddings)
        return np.asarray(pred), time.perf_counter() - t0 + self._test_seconds

    def body(self, texts, labels, seed: int) -> tuple[np.ndarray, float, dict]:
        """(b): SetFit's Trainer with default arguments (one epoch), body + head; predictions, seconds, info."""
        from datasets import Dataset
        from setfit import Trainer, TrainingArguments

        model = self._load()
        # SetFit's defaults, but nothing written outside work_dir: no checkpoints, no loggers
        args = TrainingArguments(seed=seed, show_progress_bar=False, num_epochs=1, max_steps=self.cfg.setfit_max_steps or -1,
                                 output_dir=str(self.work_dir / "checkpoints"), logging_dir=str(self.work_dir / "logs"),
                                 save_strategy="no", report_to="none")
        trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_dict({"text": texts, "label": list(labels)}))
        t0 = time.perf_counter()
        trainer.train()
        pred = np.asarray(model.predict(self.test_texts))
        seconds = time.perf_counter() - t0
        from setfit.sampler import ContrastiveDataset

        pairs = len(ContrastiveDataset(texts, list(labels), model.multi_target_strategy, sampling_strategy="oversampling"))
        state = getattr(getattr(trainer, "st_trainer", None), "state", None)  # SetFit trains through an ST trainer
        return pred, seconds, {"epoch_pairs": pairs, "epoch_steps": -(-pairs // args.embedding_batch_size),
                               "steps": getattr(state, "global_step", None)}


def run_setfit_compare(cfg: SetFitCompareConfig, out_dir: str, log=print) -> str:
    """Every method x shots x seed (skipping finished runs); write runs.parquet and the table; return it."""
    from sklearn.metrics import f1_score

    from headstore.heads.kinds.labels import few_shot_indices

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "config.json", asdict(cfg), indent=1)
    store, task = _task(cfg)
    text_of = store.texts.sort("row")["text"].to_list()
    test = task.eval_sets["test"]
    setfit = None
    made_of = _made_of(cfg, store, task, text_of)
    rows = _kept_rows(out / "runs.parquet", made_of)
    done = {(r["method"], r["shots"], r["seed"]) for r in rows}
    C = len(task.class_names)

    def scored(method, shots, seed, pred, seconds, **extra):
        return {"method": method, "shots": shots, "seed": seed, "accuracy": float((pred == test.classes).mean()),
                "macro_f1": float(f1_score(test.classes, pred, labels=np.arange(C), average="macro", zero_division=0)),
                "seconds": seconds, "made_of": made_of, **extra}

    for shots in cfg.shots:
        for seed in cfg.seeds:
            rows += [r | {"made_of": made_of} for r in _headstore_runs(cfg, store, task, shots, seed, done)]
            _save(out, rows)
            sample = task.pool.subset(few_shot_indices(task.pool.classes, shots, seed))
            texts, labels = [text_of[r] for r in sample.rows], sample.classes
            if setfit is None:
                setfit = _SetFit(cfg, [text_of[r] for r in test.rows], test.classes, out / "setfit-trainer")
            if ("SetFit (a) frozen body + LR", shots, seed) not in done:
                pred, seconds = setfit.frozen(texts, labels, seed)
                rows.append(scored("SetFit (a) frozen body + LR", shots, seed, pred, seconds))
                _save(out, rows)
            method = "SetFit (b) contrastive body" + (f" (capped at {cfg.setfit_max_steps} steps)"
                                                      if cfg.setfit_max_steps else " (1 epoch)")
            if cfg.setfit_body and (method, shots, seed) not in done:
                log(f"[setfit-compare] SetFit body fine-tuning: shots {shots}, seed {seed}")
                pred, seconds, info = setfit.body(texts, labels, seed)
                rows.append(scored(method, shots, seed, pred, seconds, **info))
                _save(out, rows)
    return _report(cfg, out, pl.DataFrame(rows, infer_schema_length=None), len(test), setfit)


def _made_of(cfg: SetFitCompareConfig, store, task, text_of: list[str]) -> str:
    """What every row's figures depend on beside its method, shots and seed, as a key (data/keys.py's rule): the
    store's encoder (its fingerprint), the labelled texts the shots are drawn from and the test texts (each text
    and class, in order: the shot draw depends on it), the class names and the settings that shape these, the
    recipe versions (this comparison's and headstore's head recipe), each head's resolved settings, and the
    versions of SetFit and scikit-learn (SetFit's runs, every probe)."""
    digest = hashlib.sha256(json.dumps({"store": store.fingerprint, "model": cfg.model, "format": cfg.data_format,
                                        "test_per_class": cfg.test_per_class, "classes": list(task.class_names),
                                        "recipes": [recipe("setfit-compare"), recipe("train-head")],
                                        "heads": _head_settings(cfg, task), "libraries": {d: library_version(d) for d in ("setfit", "scikit-learn")}},
                                       sort_keys=True, default=str).encode())
    for data in (task.pool, task.eval_sets["test"]):
        for row, cls in zip(data.rows.tolist(), np.asarray(data.classes).tolist()):
            digest.update(f"{cls}\x00{text_of[row]}\x01".encode())
    return digest.hexdigest()[:16]


def _head_settings(cfg: SetFitCompareConfig, task) -> dict:
    """{loss: its head's and training's resolved settings at each shot count} (seed 0: the seed is the row's)."""
    from headstore.heads.settings.config import KIND_DEPENDENT, HeadConfig, TrainConfig
    from headstore.heads.training.run import defaults_for_kind

    unset = tuple(k for k in KIND_DEPENDENT if k != "loss")  # as _head_rows trains them
    return {f"{loss}/{shots}": [resolved(c) for c in defaults_for_kind(
        task, HeadConfig(), TrainConfig(loss=loss, shots=shots, seed=0), unset)[:2]]
        for loss in cfg.losses for shots in cfg.shots}


def _kept_rows(path: Path, made_of: str) -> list[dict]:
    """The finished rows of an earlier run into the same --out, if they were made of the same store, texts and
    settings (`_made_of`); rows of anything else are refused, never mixed into this run's table."""
    if not path.is_file():
        return []
    rows = read_parquet_or_explain(path, "the finished runs are damaged: give another --out, or move that folder "
                                         "away").to_dicts()
    other = [r for r in rows if r.get("made_of") != made_of]
    if other:
        keys = sorted({str(r.get("made_of")) for r in other})
        raise ValueError(f"{path}: {len(other)} of its {len(rows)} rows were made from another store, dataset or "
                         f"test sample, or by another head recipe or SetFit version (made_of {', '.join(keys)}; this run's {made_of}"
                         + ("; None: rows written before runs were keyed" if "None" in keys else "")
                         + "): give another --out, or move that folder away")
    return rows


def _save(out: Path, rows: list[dict]) -> None:
    if rows:
        atomic_write_parquet(out / "runs.parquet", pl.DataFrame(rows, infer_schema_length=None))


def _report(cfg, out: Path, frame: pl.DataFrame, n_test: int, setfit) -> str:
    lines = ["| method | shots | seeds | accuracy | macro-F1 | seconds per run |", "|---|---|---|---|---|---|"]
    summary = []
    for (method, shots), g in frame.group_by(["method", "shots"], maintain_order=True):
        acc, f1 = mean_std_ci(g["accuracy"].to_numpy()), mean_std_ci(g["macro_f1"].to_numpy())
        sec = float(g["seconds"].mean())
        summary.append({"method": method, "shots": shots, "accuracy": acc, "macro_f1": f1, "seconds": sec})
        lines.append(f"| {method} | {shots} | {acc['n']} | {acc['mean']:.3f} ± {acc['std']:.3f} "
                     f"[{acc['ci_lo']:.3f}, {acc['ci_hi']:.3f}] | {f1['mean']:.3f} ± {f1['std']:.3f} | {sec:.1f} |")
    notes = ["", f"Test texts: {n_test} ({'all of test' if not cfg.test_per_class else f'{cfg.test_per_class} per class, seed 0'})."
             f" Seeds {list(cfg.seeds)} draw the labelled texts (the same for every method)."]
    if setfit is not None and setfit._test_seconds:
        notes.append(f"featurize_note: encoding the test texts with the frozen body took {setfit._test_seconds:.1f} s "
                     "(SetFit (a) pays it, added to its seconds; headstore's store had them already).")
    body = frame.filter(pl.col("method").str.starts_with("SetFit (b)"))
    if body.height and "epoch_steps" in body.columns:
        r = body.row(0, named=True)
        notes.append(f"SetFit (b): one default epoch = {r['epoch_pairs']} pairs = {r['epoch_steps']} steps of 16 pairs"
                     + (f"; capped at {cfg.setfit_max_steps} steps here (a deviation from its defaults, made for CPU time)"
                        if cfg.setfit_max_steps else "") + ".")
    table = "\n".join(lines + notes)
    atomic_write_text(out / "setfit.md", table + "\n")
    atomic_write_json(out / "setfit.json", summary, indent=1)
    return table
