"""`cli train-head`: train one head on a dataset's stored features, evaluate, write the artefacts (`cli eval`,
a trained head scored again: heads.training.eval_run).

Output directory:
- `head.safetensors` (+ `normalizer.safetensors`): the head, loadable by `heads.training.run.load_head`;
- `config.json`: every setting, the dataset, the store path and fingerprint;
- `metrics.json`: `{"baseline": {...}, "head": {...}}` on the test split, the dev figures under
  `"dev"`, the primary metric's name and bootstrap 95% CIs under `"ci"`, how the dataset is evaluated
  (`"evaluation"`), how dev was made (`"dev_made"`), an STS table's score scale (`"score_range"`) and what
  the task kind says a reader must know of the figures (`"warnings"`, also printed under the terminal table:
  e.g. no test query with a relevant document);
- `judgements.parquet`: the training pairs as text ids (heads.artefacts.judged), what any later scoring splits
  its IR figures on: seen and unseen queries (heads.kinds.seen; metrics.json "parts" of test and dev);
- `curve.png`: training loss and dev metric per epoch;
- `run.<split>.trec` (IR tasks): the head's top-100 per query, for trec_eval (`heads.trec`);
- `memory.safetensors` (IR tasks with training judgements, where dev keeps it; `memory`: auto | on | off): the
  document memory (heads.training.memory_use, docs/memory.md), said in metrics.json "memory".
`cli eval` writes `metrics.json` and the run files of the splits it scores.

`--out` is checked before any work (`data.outputs.prepare_output_dir`): an existing file, a store, or a
folder holding another head or another command's output is refused unless `--overwrite`.
"""
from __future__ import annotations

from dataclasses import asdict

import torch

from headstore.data.files import atomic_write_json
from headstore.data.memory import trim_heap
from headstore.data.outputs import begin_output, end_output, prepare_output_dir
from headstore.data.progress import progress_write
from headstore.featurize.encoder.hardware import warn_if_emulated_bf16
from headstore.featurize.encoder.model import pick_device
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.artefacts.curve import plot_curve
from headstore.heads.artefacts.files import write_head_dir
from headstore.heads.artefacts.head import Head
from headstore.heads.artefacts.judged import write_judgements
from headstore.heads.artefacts.task_features import TaskFeatures, rows_of_datasets
from headstore.heads.evaluation.evaluate import TEST_SPLIT, embedder, evaluate_baseline, evaluate_head
from headstore.heads.kinds import Task, judgement_pairs, kind_of, load_task, task_seen_masks
from headstore.heads.kinds.labels import label_space, shots_note
from headstore.heads.kinds.unlabeled import unlabeled_report
from headstore.heads.network.features import array_list, array_widths
from headstore.heads.settings.config import STRENGTH_AUTO, HeadConfig, TrainConfig
from headstore.heads.training.anchor import anchor_rows_of
from headstore.heads.training.kind_defaults import defaults_for_kind, head_shape  # noqa: F401  (importable here)
from headstore.heads.training.label_recipes import data_decided_notes, decided_by_data, unlabeled_cfg
from headstore.heads.training.selection import DEFAULT_DELTA, load_selection
from headstore.heads.artefacts.memory import MEMORY_FILE
from headstore.heads.training.lexical_fit import wanted as lexical_wanted, without_texts, write_lexical
from headstore.heads.training.memory_use import fit_for_head, memory_block, wanted
from headstore.heads.training.resolved import ResolvedTraining, resolve_stack
from headstore.heads.training.strength import STRENGTHS, plot_strength
from headstore.heads.training.train import train_one

# fingerprint parts that change the numbers of a feature (the layer of the head's array is checked apart)
FEATURE_PARTS = ("model_id", "weights_hash", "tokenizer_hash", "pooling", "max_length", "dtype", "precision",
                 "code_version")
SPLITS = ("dev", TEST_SPLIT)  # what train-head scores: dev (selection), test (reported once)
# parts a store has only where set (featurize.encoder.sentence, prompts): absent on both sides = equal
SENTENCE_PARTS = ("include_prompt", "dense", "normalize", "prompts")


def normalizes(config: dict) -> bool:
    """A head whose normaliser ends in L2 sees the same features whether or not the store applies the model's
    Normalize on read (a store migrated by `cli store migrate` keeps its heads valid)."""
    return TrainConfig.from_dict(config["train"]).normalize == "l2" and config.get("head", {}).get("mix", 1) == 1


def _array_layer(store: FeatureStore, array: str):
    """The encoder layer a store array holds (None where the manifest does not say); for several arrays
    joined by '+' (a mixing head), the list of their layers."""
    layers = []
    for name in array_list(array):
        if name not in store.arrays:
            raise ValueError(f"{store.path}: no array {name!r}; its arrays: {', '.join(store.arrays)} (--array)")
        info = store.manifest.get("arrays", {}).get(name)
        layers.append(info.get("layer") if isinstance(info, dict) else None)
    return layers[0] if len(layers) == 1 else layers


def _data_notes(task: Task) -> dict:
    """How the dataset was read and split, for config.json and metrics.json."""
    notes = {"evaluation": task.evaluation, "dev_made": task.dev_note or "the dataset's own dev split"}
    if task.score_range is not None:
        notes["score_range"] = list(task.score_range)
    return notes


def _head_notes(task: Task, store: FeatureStore, array: str, layer) -> dict:
    """What config.json says of the task and the store a head was trained on (besides its settings)."""
    return {"task": task.name, "kind": task.kind, "dev": task.dev_note or "the dataset's dev split",
            **_data_notes(task), "store_fingerprint": store.fingerprint, "array": array, "array_layer": layer,
            "store_manifest": {k: v for k, v in store.manifest.items() if k != "arrays"}, **label_space(task)}


def train_head(store_path: str, data_path: str, out_dir: str, head_cfg: HeadConfig, cfg: TrainConfig,
               data_format: str | None = None, array: str = "features", progress: bool = True,
               score_range=None, overwrite: bool = False, select_ood: tuple[str, ...] = (),
               ood_delta: float = DEFAULT_DELTA, kind_defaults: tuple[str, ...] = (), device: str = "auto",
               unlabeled: tuple[str, ...] = (), memory: str = "auto", lexical: str = "auto") -> dict:
    """Train one head on `data_path`'s train split, select on dev, report test once; write `out_dir`.
    score_range: the (LO, HI) scale of an STS table's scores (default: detected as 0-1 or 0-5).
    select_ood / ood_delta: out-of-domain dev sets in the selection rule (heads.training.selection).
    kind_defaults: settings the user left unset (of config.KIND_DEPENDENT): the task kind's `defaults` fill
    them (graded STS tables; labelled texts: the recipe their dev split chooses, heads.training.label_recipes),
    other data keep the dataclass defaults (the SciFact study's). device: where the task's features and the head
    live (auto: cuda when available). unlabeled: --unlabeled files (heads.kinds.unlabeled): for positives-only
    pairs the corpus dev and test rank and impostors are mined from, and the anchor regulariser's sample."""
    inputs = (data_path, *select_ood, *unlabeled)
    device = pick_device(device)
    prepare_output_dir(out_dir, "head", overwrite, inputs=inputs, create=False)  # refuse before training
    store = FeatureStore.open(store_path)
    layer = _array_layer(store, array)
    task = load_task(data_path, store, data_format, score_range=score_range, unlabeled=unlabeled)
    given = (head_cfg, cfg)  # the user's settings: a recipe chosen on dev fills what they leave (label_recipes)
    head_cfg, cfg, defaults_note = defaults_for_kind(task, head_cfg, cfg, kind_defaults, len(array_list(array)))
    unlabeled_note = unlabeled_report(task, unlabeled_cfg(task, given[1], cfg, kind_defaults), SPLITS)  # none: error
    warn_if_emulated_bf16(cfg.precision, device)  # one line where bf16 is emulated (a CPU without it)
    task = kind_of(task).for_training(task, cfg)  # labelled texts: shots, hierarchy
    if getattr(task, "report", {}).get("shots_clipped"):  # more --shots than a class has: said on the terminal
        progress_write(f"note: {shots_note(cfg.shots, task.report['shots_clipped'])}")
    seen, judged_pairs = task_seen_masks(task, SPLITS), judgement_pairs(task)  # store rows (heads.kinds.seen)
    with_lexical = lexical_wanted(task, lexical)  # BM25 fused in (heads.training.lexical_fit): asked where it cannot be
    task = task if with_lexical else without_texts(task)  # the splits' texts serve it alone
    raw_task = task if wanted(task, memory) else None  # (store rows) a memory asked for where it cannot be: an error
    task, features, selection, anchor = training_features(store, task, cfg.anchor_weight, cfg.anchor_data, array,
                                                          select_ood, ood_delta, device, f"--data {data_path}")
    decided = decided_by_data(task, features, store.dim, given, kind_defaults, array)  # labelled texts: dev's recipe
    head_cfg, cfg, task, defaults_note = decided.get("chosen", (head_cfg, cfg, task, defaults_note))
    head_cfg = head_shape(head_cfg, features, array, task, cfg, array_widths(store, array))
    plan = resolve_stack([cfg])  # the data has decided: every setting resolved once, only read below (resolved.py)
    baseline = evaluate_baseline(task, features, SPLITS, dim=store.dim)  # before the features are normalised
    trim_heap()  # (and after training: its freed transients back to the OS before evaluation adds its own)
    model, norm, run = train_one(task, features, head_cfg, plan, progress, selection, anchor, in_place=True)
    trim_heap()
    # `features` now hold the head's inputs (normalised in place: one copy of the task's features in memory)
    out = prepare_output_dir(out_dir, "head", overwrite, inputs=inputs)
    begin_output(out, "head")  # an interrupted write (a full disk) is replaced by the same command's rerun
    config = {"head": asdict(head_cfg), "train": cfg.to_dict(), "data": str(data_path), "format": data_format,
              **({"unlabeled": list(unlabeled)} if unlabeled else {}), **_head_notes(task, store, array, layer),
              "store": str(store_path), "best_epoch": run.best_epoch, "train_seconds": run.seconds,
              "defaults": defaults_note, "device": device, **({"selection": selection.describe()} if selection else {})}
    write_head_dir(out, model, norm, {**config, "judged": write_judgements(out, store, judged_pairs)})
    rankings, items = {}, {}  # the head's rankings of dev and test (run files, candidate share); per-item values
    metrics = evaluate_head(task, features, model, None, plan.eval_energy, SPLITS, dim=store.dim, baseline=baseline,
                            rankings=rankings, items=items, seen=seen)
    metrics.update(_data_notes(task), **data_decided_notes(decided, items, metrics["primary"]),
                   **write_memory(out, store, raw_task, task, features, model, plan, items, with_lexical, seen),
                   **({"unlabeled": unlabeled_note} if unlabeled_note else {}))
    metrics.update(training_notes(task, metrics, run, plan, head_cfg, selection, ood_delta, rankings, data_path))
    atomic_write_json(out / "metrics.json", metrics, sort_keys=True)
    write_runs(task, features, model, None, plan.eval_energy, SPLITS, out, rankings)
    plot_run(out, task.name, run, plan, metrics["primary"])
    end_output(out)
    return metrics


def plot_run(out, name: str, run, plan: ResolvedTraining, metric: str) -> None:
    """curve.png (training loss and dev metric per epoch) and, where a strength was scored, strength.png."""
    plot_curve(run.history, out / "curve.png", title=f"{name}: {plan.loss} ({plan.eval_energy})")
    if run.strength_curve:
        plot_strength(run.strength_curve, run.strength, out / "strength.png", metric,
                      title=f"{name}: strength a (chosen {run.strength:g})")


def write_memory(out, store, raw_task, task, features, model, plan: ResolvedTraining, items: dict,
                 with_lexical: bool, seen: dict) -> dict:
    """{"memory": ..., "lexical": ...}: the head's document memory fitted on its inputs (`features`, normalised in
    place), saved in `out` where dev kept it (none without raw_task), then with `with_lexical` BM25's weight and the
    memory's gain chosen on dev (heads.training.lexical_fit), and what they give (metrics.json)."""
    block, placed, held_out = {}, None, None
    if raw_task is not None:
        memory, placed, fit, held_out = fit_for_head(store, raw_task, task, features, model, plan.eval_energy,
                                                     plan.negatives, plan.precision)
        if memory is not None:
            memory.save(out / MEMORY_FILE)
        block["memory"] = (memory_block(task, features, model, None, placed, plan.eval_energy, items, fit)
                           if memory is not None else {"fit": fit})
    if with_lexical:
        block.update(write_lexical(out, task, features, model, plan.eval_energy, items, placed, held_out, store.dim,
                                   seen))
    return block


def training_features(store: FeatureStore, task: Task, anchor_weight: float, anchor_data: str, array: str,
                      select_ood: tuple[str, ...], ood_delta: float, device: str, data: str | None = None):
    """(task, features, selection, anchor): the store rows the task, the --select-ood sets and the anchor
    (--anchor-weight on --anchor-data) use, read once onto `device` (heads.artefacts.task_features), the task
    remapped to them; the out-of-domain selection sets (None without --select-ood) and the anchor's pool at
    positions (None: the anchor is off)."""
    anchor = anchor_rows_of(store, task, anchor_weight, anchor_data)  # the task's own texts (or --anchor-data),
    # never dev or test
    tf = TaskFeatures.for_task(store, task, rows_of_datasets(store, select_ood),
                               *([anchor.rows] if anchor is not None else []), device=device)
    task, features = tf.remap(task), tf.read(array)  # only the rows the task uses (heads.artefacts.task_features)
    selection = load_selection(store, select_ood, task, features[:, :store.dim], ood_delta, remap=tf.remap, data=data)
    return task, features, selection, None if anchor is None else anchor.mapped(tf.positions)


def training_notes(task: Task, metrics: dict, run, plan: ResolvedTraining, head_cfg: HeadConfig, selection,
                   ood_delta: float, rankings: dict, data_path: str) -> dict:
    """What train-head's metrics.json says beside the scores in `metrics`: the guard against the frozen
    features, the out-of-domain selection, a missing test split, the history, how negatives were mined and dev
    ranked, the strength, and what was read of labelled texts."""
    notes = {"guard": guard_report(task, metrics, run, plan, head_cfg)}
    if selection:
        notes["selection"] = {**selection.describe(), "ood_dev_loss": run.best_sel_loss,
                              "within_delta": run.best_sel_loss is not None and run.best_sel_loss <= ood_delta}
    if TEST_SPLIT not in task.eval_sets:
        notes["split"] = "dev"
        notes["note"] = f"{data_path} has no test split: only dev figures are reported"
    notes["history"] = run.history
    if run.scoring.get("every_steps", 0) < run.scoring.get("epoch_steps", 0):  # scored within epochs: how often,
        # and where early stopping ended training (once an epoch, the history says it all)
        notes["dev_scoring"] = {**run.scoring, "best_step": run.best_step, "stopped_at_step": run.stopped_step}
    if run.anchor:
        notes["anchor"] = run.anchor
    notes.update(scale_report(task, run, rankings))
    if plan.adjusts_strength:
        notes["strength"] = strength_report(run, plan.strength_setting, selection)
    if getattr(task, "report", None):  # labelled texts: unseen labels, skipped texts, duplicates
        notes["data_report"] = task.report
    return notes


def scale_report(task: Task, run, rankings: dict) -> dict:
    """metrics.json "negatives" (how hard negatives were mined) and "dev_candidates" (how dev was ranked each
    epoch; with candidates, the share of the head's exact top-10 inside them, on every dev query, from the
    rankings evaluate_head kept)."""
    out = {"negatives": run.negatives} if run.negatives else {}
    if run.dev_candidates:
        share = kind_of(task).candidate_share(task, "dev", run.select_set, rankings)
        out["dev_candidates"] = {**run.dev_candidates, **share}
    return out


def strength_report(run, setting: str, selection) -> dict:
    """metrics.json "strength": the a applied (--strength `setting`), how it was chosen, and the dev curve over a
    (heads.training.strength)."""
    rule = ("fixed by --strength" if setting != STRENGTH_AUTO else
            "the best in-domain dev " + (f"whose worst out-of-domain dev loss is <= {selection.delta}, else the "
                                         "least-losing" if selection else "") + "; ties to the larger a")
    return {"setting": setting, "chosen": run.strength, "rule": rule, "strengths": list(STRENGTHS),
            "curve": run.strength_curve, "plot": "strength.png" if run.strength_curve else None}


def guard_report(task: Task, metrics: dict, run, plan: ResolvedTraining, head_cfg: HeadConfig | None = None) -> dict:
    """The head against the frozen baseline on dev in the user's metric (metrics.json "guard"), with a
    warning saying what to try when the head is worse than the frozen features with cosine: settings to change
    from those this head was trained with (the kind's `suggest`), never those same settings."""
    dev = metrics.get("dev")
    report = {"enabled": plan.guard, "start_dev": run.start_dev, "best_epoch": run.best_epoch,
              "returned": "the starting point (epoch 0: no update kept)" if run.best_epoch == 0
              else f"the trained head (epoch {run.best_epoch})"}
    if not dev:
        return report
    frozen, head = dev["baseline"][metrics["baseline_primary"]], dev["head"][metrics["primary"]]
    report.update(frozen_dev=frozen, head_dev=head, head_minus_frozen=head - frozen,
                  worse_than_frozen=bool(head < frozen))
    if head < frozen:  # the kind suggests settings other than those given (the head's settings as given)
        suggestion = kind_of(task).suggest(task, head_cfg or HeadConfig(), plan.settings[0])
        report["warning"] = (f"the head is WORSE than no head on dev: {metrics['primary']} {head:.4f} vs "
                             f"{frozen:.4f} for the frozen features with cosine ({head - frozen:+.4f}). "
                             f"Try: {suggestion}; or use the frozen features with cosine (no head).")
    return report


def load_head(head_dir: str):
    """(model, normalizer, config dict) of a head directory, or of `GRID#rank=K` / `GRID#id=HEAD_ID`."""
    head = Head.load(head_dir)
    return head.model, head.normalizer, head.config


def check_same_features(head_dir: str, config: dict, store: FeatureStore, array: str) -> None:
    """A head only makes sense on the features it was trained on: every fingerprint part that changes the
    numbers (model, weights, tokenizer, pooling, max length, dtype, precision, code version) and the
    encoder layer of its array must match."""
    trained, here = config["store_manifest"], store.manifest  # fingerprint parts are top-level keys
    if trained.get("dim") not in (None, store.dim):
        raise ValueError(f"{head_dir} was trained on {trained['dim']}-dim features; {store.path} holds "
                         f"{store.dim}-dim features (evaluate it on the store it was trained on)")
    differs = [f"{k}: {trained[k]!r} vs {here.get(k)!r}" for k in FEATURE_PARTS
               if k in trained and trained[k] != here.get(k)]
    differs += [f"{k}: {trained.get(k)!r} vs {here.get(k)!r}" for k in SENTENCE_PARTS if trained.get(k) != here.get(k)
                and not (k == "normalize" and normalizes(config))]
    layer = _array_layer(store, array)
    trained_layer = config.get("array_layer")
    if trained_layer is None and "layers" in trained and array == "features":  # configs before array_layer
        trained_layer = trained["layers"][0]
    if trained_layer is not None and layer is not None and trained_layer != layer:
        differs.append(f"layer of {array!r}: {trained_layer} vs {layer}")
    if differs:
        raise ValueError(f"{head_dir} was trained on features that differ from {store.path} in "
                         f"{'; '.join(differs)} (a head only makes sense on the features it was trained on: "
                         "featurize the dataset with the head's settings)")


def write_runs(task: Task, features: torch.Tensor, model, norm, energy: str, splits: tuple[str, ...], out_dir,
               rankings: dict | None = None) -> list:
    """The task kind's run files of the head on `splits` (IR: `run.<split>.trec`, for trec_eval), from the
    rankings evaluate_head kept where given."""
    return kind_of(task).write_runs(task, embedder(model, features, norm), energy, splits, out_dir, task.name,
                                    rankings)
