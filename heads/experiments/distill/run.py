"""`cli distill`: move what a teacher knows into one head on the frozen store's features (issue 42, part 2).

    headstore.distill("runs/store", "data/scifact", "runs/grid#ensemble=3", "runs/distilled")

The teacher is any head `Head.load` reads over the same store: a `cli train-head` folder, an ensemble folder,
`GRID#rank=K`, `GRID#ensemble=K`. Its energies on the stored features are the soft targets over each anchor's
candidate set (heads.training.distill_targets, cached in OUT keyed by everything that made them); the student is
a head of train-head's shape and settings trained to match them (heads.training.distill), selected on dev,
reported once on test with bootstrap CIs beside the frozen features and the teacher. OUT is a head folder like
train-head's (eval, export, index, the Pipeline take it) plus the targets cache; config.json "distill" and
metrics.json "teacher", "distill" say what was done.

A rerun of the same command into OUT reuses the cached targets (the costly part) and trains again from the start:
the same settings give the same head. Refused in one line: a teacher over another store (fingerprint differs),
an ensemble of one (distil its head, or name it), a classifier teacher, a temperature <= 0 (DistillConfig).
"""
from __future__ import annotations

import hashlib
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np

from headstore.data.files import atomic_write_json
from headstore.data.outputs import begin_output, end_output, prepare_output_dir
from headstore.data.progress import progress_write
from headstore.featurize.encoder.model import pick_device
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.artefacts.curve import plot_curve
from headstore.heads.artefacts.files import write_head_dir
from headstore.heads.artefacts.head import EnsembleHead, Head
from headstore.heads.artefacts.judged import write_judgements
from headstore.heads.experiments.distill.report import (SPLITS, Beside, best_member, n_parameters, read_stored,
                                                        to_device, transfer_tasks)
from headstore.heads.experiments.distill.tuned import TunedTeacherStore, tuned_head_dir
from headstore.heads.kinds import judgement_pairs, load_task
from headstore.heads.kinds.unlabeled import unlabeled_report
from headstore.heads.network.features import array_widths
from headstore.heads.scoring.losses import distill_losses
from headstore.heads.artefacts.task_features import TaskFeatures
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.settings.distill import DistillConfig
from headstore.heads.training.distill import distill_stack
from headstore.heads.training.distill_targets import (HeadTeacher, Targets, anchor_and_corpus_rows, make_targets,
                                                       parts_path, read_targets, targets_key, targets_path,
                                                       write_targets)
from headstore.heads.network.features import array_list
from headstore.heads.training.resolved import resolve_stack
from headstore.heads.training.run import _array_layer, _data_notes, check_same_features, defaults_for_kind, head_shape

def load_teacher(ref: str, store: FeatureStore, what: str = "--teacher") -> Head:
    """The teacher (or `what`: the --single head) `ref` names (Head.load), checked against the student's store."""
    teacher = Head.load(ref)
    if isinstance(teacher, EnsembleHead) and len(teacher.members) == 1 and what == "--teacher":
        raise ValueError(f"--teacher {ref}: an ensemble of one head is that head; name it ({teacher.members[0].source}) "
                         "or give an ensemble of at least 2 (GRID#ensemble=K, K >= 2)")
    if teacher.is_classifier:
        raise ValueError(f"{what} {ref}: a classifier head (loss ce) scores classes, not pairs: it has no energies "
                         "to distil")
    if teacher.store_fingerprint != store.fingerprint:
        raise ValueError(f"{what} {ref} was trained over another store (fingerprint {teacher.store_fingerprint[:12]}"
                         f" vs {store.fingerprint[:12]} of {store.path}): a head teacher scores the student's stored "
                         "features; give a teacher trained on this store")
    check_same_features(ref, teacher.config, store, teacher.array)
    return teacher


def open_teacher(ref: str, store: FeatureStore, teacher_store: str | None, device) -> tuple[Head, object]:
    """(the teacher, `read(tf, array)` of the features it scores): a head over the store reads the store's; a
    tuned-encoder teacher (heads.experiments.distill.tuned) its own store's, at the same texts."""
    tuned = tuned_head_dir(ref)
    if tuned is None:
        if teacher_store:
            raise ValueError(f"--teacher-store {teacher_store}: only for a tuned-encoder teacher (the output of "
                             f"cli finetune); {ref} is a head over the student's store")
        return to_device(load_teacher(ref, store), device), read_stored
    head = Head.load(tuned)
    if head.is_classifier:
        raise ValueError(f"--teacher {ref}: a classifier head (loss ce) has no energies to distil")
    reader = TunedTeacherStore(head, store, teacher_store)
    return to_device(head, device), lambda tf, array: reader.read(tf.rows, array).to(device)


def student_start(dcfg: DistillConfig, single: Head | None, head_cfg: HeadConfig, array: str):
    """(the student's shape, its init): train-head's fresh head, or the best single head's shape and weights."""
    if dcfg.student_init == "fresh":
        return head_cfg, None
    if single is None:
        raise ValueError("--student-init single: no single head to start from; give --single HEAD (or an ensemble "
                         "teacher, whose best-dev member is the single head)")
    if single.array != array or single.query_side:
        raise ValueError(f"--student-init single: {single.source} reads array {single.array!r}"
                         f"{' as a query-side head' if single.query_side else ''}; the student reads {array!r} "
                         "on both sides")
    return single.head_config, (single.model, single.normalizer)


def check_embedding_student(teacher: Head, head_cfg: HeadConfig, dcfg: DistillConfig) -> None:
    """An embedding loss regresses the student's outputs onto the teacher's: both sides of every pair through one
    head of the teacher's output width, or ValueError naming what to set."""
    if teacher.query_side or head_cfg.sides != "both":
        raise ValueError(f"--distill-loss {dcfg.distill_loss}: embedding-mse needs teacher and student heads that take "
                         "both sides of a pair (sides both); drop embedding-mse for a query-side head")
    if head_cfg.out_features != teacher.out_dim:
        raise ValueError(f"--distill-loss {dcfg.distill_loss}: the student outputs {head_cfg.out_features} values, the "
                         f"teacher {teacher.out_dim}: embedding-mse needs the same width (--out-dim "
                         f"{teacher.out_dim}{', with --no-residual' if teacher.out_dim != head_cfg.in_dim else ''})")


def teacher_key(teacher: Head) -> str:
    """sha256 of the teacher's weights, normalisers, energy and store (a tuned encoder's: its weights' too)."""
    h = hashlib.sha256((teacher.energy_name + teacher.store_fingerprint).encode())
    for member in getattr(teacher, "members", [teacher]):
        for name, t in sorted(member.model.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        norm = member.normalizer
        h.update(f"{norm.kind}/{norm.blocks}".encode())
        for t in (norm.center, norm.scale):
            h.update(t.detach().cpu().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def _teacher_targets(out_dir, key: str, teacher, teacher_features, features, tf, rows: tuple, head_cfg: HeadConfig,
                     dcfg: DistillConfig, progress: bool):
    """(the teacher's targets over the anchors' candidate sets, and its outputs of the anchors where the loss
    reads embeddings; whether they were made now): the student is checked first, before the teacher's pass."""
    anchors, corpus = rows
    embedding_loss = any(spec.reads == "embeddings" for spec in distill_losses(dcfg.distill_loss))
    if embedding_loss:
        check_embedding_student(teacher, head_cfg, dcfg)  # before the teacher's pass writes its targets
    targets, made = _targets(out_dir, key, teacher, teacher_features, features, tf, anchors, corpus, dcfg, progress)
    if embedding_loss:  # (U, d) the teacher's outputs of the anchors
        targets = targets.with_embeddings(teacher_outputs(teacher, teacher_features, tf, anchors, targets))
    return targets, made


def distill(store_path: str, data_path: str, teacher_ref: str, out_dir: str, head_cfg: HeadConfig = HeadConfig(),
            cfg: TrainConfig = TrainConfig(), dcfg: DistillConfig = DistillConfig(), data_format: str | None = None,
            array: str = "features", progress: bool = True, overwrite: bool = False,
            kind_defaults: tuple[str, ...] = (), device: str = "auto", unlabeled: tuple[str, ...] = (),
            transfer: tuple[str, ...] = (), single: str | None = None, items: dict | None = None,
            teacher_store: str | None = None) -> dict:
    """Distil `teacher_ref` into one head on `data_path`'s stored features; write `out_dir`; returns metrics.
    transfer: out-of-domain datasets every column is also scored on; single: the best single head to show
    beside (default: an ensemble teacher's best-dev member); items: filled with per-item test values."""
    refs = [r.rpartition("#")[0] or r for r in (teacher_ref, *([single] if single else []))]
    inputs = (data_path, *refs, *unlabeled, *transfer)
    device = pick_device(device)
    prepare_output_dir(out_dir, "head", overwrite, inputs=inputs, create=False)  # refuse before any work
    store = FeatureStore.open(store_path)
    layer = _array_layer(store, array)
    teacher, read_teacher = open_teacher(teacher_ref, store, teacher_store, device)
    task = load_task(data_path, store, data_format, unlabeled=unlabeled)
    head_cfg, cfg, defaults_note = defaults_for_kind(task, head_cfg, cfg, kind_defaults, len(array_list(array)))
    anchors, corpus, anchors_note = anchor_and_corpus_rows(task, dcfg.unlabeled_anchors, dcfg.sample_seed)
    ood, ood_dropped = transfer_tasks(task, store, transfer, device, f"--data {data_path}")  # before positions
    tf = TaskFeatures.for_task(store, task, anchors, corpus, device=device)
    judged, (task, features) = judgement_pairs(task), (tf.remap(task), tf.read(array))  # judged: store rows
    tkey = teacher_key(teacher)
    key = targets_key(tkey, store, (array, teacher.array), anchors, corpus, dcfg.target_settings())
    teacher_features = read_teacher(tf, teacher.array)  # read once: a tuned teacher's come from its own store
    single_head = load_teacher(single, store, what="--single") if single else best_member(
        teacher, task, teacher_features, store.dim)
    beside = Beside(task, store, tf, array, teacher, single_head, ood, (tf.positions(anchors), tf.positions(corpus)),
                    device, items, read_teacher)
    shape = head_shape(head_cfg, features, array, task, cfg, array_widths(store, array))
    head_cfg, init = student_start(dcfg, single_head, shape, array)
    targets, made = _teacher_targets(out_dir, key, teacher, teacher_features, features[:, :store.dim], tf,
                                     (anchors, corpus), head_cfg, dcfg, progress)
    del teacher_features  # not held through training (Beside reads what it scores again)
    plan = resolve_stack([cfg])  # the student's settings resolved once (heads.training.resolved), read below
    model, norm, (run,) = distill_stack(task, features, head_cfg, plan, dcfg, targets.mapped(tf.positions),
                                        progress, in_place=True, init=init)  # the raw features' last use was above
    out = prepare_output_dir(out_dir, "head", overwrite, inputs=inputs)
    begin_output(out, "head")
    note = {**dcfg.to_dict(), "teacher": str(teacher_ref), "teacher_key": tkey, "teacher_energy": teacher.energy_name,
            "teacher_array": teacher.array, "targets": targets_path(out, key).name, "targets_key": key,
            "targets_made": made, "anchors": anchors_note, "candidates_per_anchor": int(targets.candidates.shape[1])}
    config = {"head": asdict(head_cfg), "train": cfg.to_dict(), "data": str(data_path), "format": data_format,
              "task": task.name, "kind": task.kind, "dev": task.dev_note or "the dataset's dev split",
              **({"unlabeled": list(unlabeled)} if unlabeled else {}), **_data_notes(task),
              "store": str(store_path), "array": array, "array_layer": layer, "best_epoch": run.best_epoch,
              "train_seconds": run.seconds, "defaults": defaults_note, "device": device, "distill": note}
    write_head_dir(out, model, norm, {**config, **_store_notes(store), "judged": write_judgements(out, store, judged)})
    metrics = beside.student(model, norm, plan.eval_energy, features)
    metrics.update(_data_notes(task), **{k: v for k, v in beside.columns.items() if k != "distilled"})
    metrics["distill"] = {**note, **beside.columns["distilled"], "student_parameters": n_parameters(model),
                          "best_epoch": run.best_epoch, "start_dev": run.start_dev, "train_seconds": run.seconds}
    metrics.update(_run_notes(task, cfg, anchors_note, run, ood_dropped))
    atomic_write_json(out / "metrics.json", metrics, sort_keys=True)
    plot_curve(run.history, out / "curve.png", title=f"{task.name}: distilled ({dcfg.distill_loss})")
    end_output(out)
    return metrics


def teacher_outputs(teacher: Head, teacher_features, tf: TaskFeatures, anchors, targets: Targets) -> np.ndarray:
    """(U, d) the teacher's outputs of the targets' anchors (store rows `anchors`), what embedding-mse regresses on."""
    assert np.array_equal(targets.anchors, anchors)
    return HeadTeacher(teacher, teacher_features).embed(tf.positions(anchors), "query").cpu().numpy()


def _run_notes(task, cfg: TrainConfig, anchors_note: dict, run, ood_dropped: dict) -> dict:
    """metrics.json's "unlabeled", "history", "transfer_dropped" (out-of-domain items whose text the student trained
    on: heads.kinds.without_seen) and "anchor" (the anchor regulariser's sample, the task's own texts)."""
    notes = {"unlabeled": _unlabeled_note(task, cfg, anchors_note), "history": run.history,
             "transfer_dropped": ood_dropped, "anchor": run.anchor}
    return {k: v for k, v in notes.items() if k == "history" or v}


def _store_notes(store: FeatureStore) -> dict:
    return {"store_fingerprint": store.fingerprint,
            "store_manifest": {k: v for k, v in store.manifest.items() if k != "arrays"}}


def _targets(out_dir, key: str, teacher: Head, teacher_features, search_features, tf: TaskFeatures,
             anchors, corpus, dcfg: DistillConfig, progress: bool) -> tuple[Targets, bool]:
    """(the targets in store rows, whether they were made now): the cache in OUT when it holds this key's."""
    path = targets_path(Path(out_dir), key)
    cached = read_targets(path, key)
    if cached is not None:
        progress_write(f"teacher targets: reused {path} ({len(cached)} anchors)")
        return cached, False
    others = [p.name for p in Path(out_dir).glob("teacher-targets-*.npz") if p != path]
    if others:  # made by another teacher, store, texts, settings or headstore: never this run's
        progress_write(f"teacher targets: {len(others)} in {out_dir} of another key ({others[0]}; what made them "
                       "differs) not reused: making this run's")
    parts = parts_path(Path(out_dir), key, tf.rows)
    made = make_targets(HeadTeacher(teacher, teacher_features), search_features, tf.positions(anchors),
                        tf.positions(corpus), dcfg.target_settings(), progress, parts)
    rows = (lambda p: p) if tf.rows is None else (lambda p: tf.rows[p])
    targets = made.mapped(rows)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    write_targets(path, key, targets)
    shutil.rmtree(parts, ignore_errors=True)  # the whole file holds them now
    return targets, True


def _unlabeled_note(task, cfg: TrainConfig, anchors_note: dict) -> dict:
    """metrics.json "unlabeled": train-head's roles of the unlabeled texts, and the distillation's."""
    if task.unlabeled is None:
        return {}
    try:
        roles = unlabeled_report(task, cfg, SPLITS)["roles"]
    except ValueError:  # no role in train-head's sense: the distillation gives them theirs below
        roles = {}
    roles["distillation anchors"] = (f"{anchors_note['unlabeled_anchors']} of them drawn as anchors the teacher "
                                     "scores a candidate set for" + (
                                         f"; {anchors_note['unlabeled_held_out']} left out, texts a dev or test item "
                                         "scores" if anchors_note.get("unlabeled_held_out") else ""))
    roles["candidates"] = "the corpus every anchor's candidates (the frozen search's, then random) come from"
    return {**task.unlabeled.report, "roles": roles}
