"""`cli grid`: train every combination of a TOML grid of head settings, stacked by shape, for every task kind.

Grid file and head ids: heads.experiments.grid_spec. Heads that share everything but lr, weight decay and
seed train together in one stack (one batched pass per step for all of them); on labelled texts `shots`
and `seed` are ordinary keys (a few-shot stack trains on the texts its seed draws, the task kind's
`for_training`), and each row carries the frozen baseline of the texts it trained on (`base_*`).

Combinations that cannot apply to the dataset (a loss the data cannot train, `--hierarchy` on flat labels)
are recorded with status `skipped` and the reason, never silently dropped. A configuration whose loss reduces
to the same objective as an earlier one's on this data (heads.scoring.losses.objective: under `--graded pearson` on
graded pairs, l1-energy and contrastive both train 1 + corr(E, s)), all else alike, would train the very same
heads: it is trained once, the plan says so, and its rows have status `same-objective` and `same_as`, the
head id of its trained twin (the leaderboard lists the objective once, under the first loss). Results are written after every
stack, so a rerun of the same grid into the same output skips finished heads and a changed grid trains only
what is new; every head is saved loadably (`GRID#rank=K`, `GRID#id=HEAD_ID`, heads.artefacts.files).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import polars as pl
import torch

from headstore.data.progress import progress_bar, progress_write
from headstore.data.files import atomic_write_json, atomic_write_text
from headstore.data.outputs import prepare_output_dir
from headstore.data.tables import read_utf8
from headstore.featurize.hardware import warn_if_emulated_bf16
from headstore.featurize.model import pick_device
from headstore.featurize.store import FeatureStore
from headstore.heads.training.anchor import anchor_rows_of
from headstore.heads.artefacts.files import RESULTS_FILE, read_results, resume_rows, save_stack, write_results
from headstore.heads.settings.config import TEST_SCOPES, HeadConfig, TrainConfig, stack_key
from headstore.heads.evaluation.evaluate import embedder, evaluate_split
from headstore.heads.experiments.ensembles import score_ensembles, write_ensembles
from headstore.heads.experiments.grid_estimate import pace_line, plan_seconds
from headstore.heads.experiments.grid_scope import check_resumed_scope, heads_to_test, scored_heads
from headstore.heads.experiments.grid_spec import GRID_VERSION, UNSET_SINCE_ID, head_id, read_grid, split_settings
from headstore.heads.experiments.report import write_report
from headstore.heads.experiments.soups import score_soups
from headstore.heads.experiments.summary import write_summary
from headstore.heads.network.features import array_list
from headstore.heads.kinds import PREFIX, WHOLE, Task, kind_of, load_task, task_rows, without_overlap
from headstore.heads.kinds.labels import label_space, shots_clipped, shots_note
from headstore.heads.kinds.unlabeled import grid_report, unlabeled_line
from headstore.heads.scoring.losses import LOSSES, applicable, objective
from headstore.heads.training.run import head_shape
from headstore.heads.training.selection import DEFAULT_DELTA, OodSelection, load_selection
from headstore.heads.artefacts.task_features import TaskFeatures, rows_of, rows_of_datasets
from headstore.heads.training import stacked_adamw
from headstore.heads.training.train import train_stack


def run_grid(store_path: str, data_path: str, grid_path: str, out_dir: str, data_format: str | None = None,
             progress: bool = True, transfer: tuple[str, ...] = (), score_range=None,
             overwrite: bool = False, select_ood: tuple[str, ...] = (), ood_delta: float = DEFAULT_DELTA,
             ensembles: tuple[int, ...] = (), score_split: str = "test", dry_run: bool = False,
             soups: tuple[int, ...] = (), test_scope: str = "auto", device: str = "auto",
             unlabeled: tuple[str, ...] = ()) -> pl.DataFrame:
    """Train every head of the grid (skipping finished ones); write results, leaderboard, summary and plots.

    `transfer`: out-of-domain datasets (texts in the store) every head is also scored on, never
    trained or selected on: columns `ood_<name>_primary` (and the frozen baseline's in baseline.json);
    a transfer table without a split column is scored whole.
    `score_range`: the scale of an STS table's scores (default: detected).
    `select_ood`: out-of-domain datasets whose dev (else train) split takes part in selection, epochs and
    configurations alike (heads.training.selection; `ood_delta` its tolerance); columns `sel_<name>_primary`, `sel_loss`.
    `ensembles`: sizes K of ensembles of the best configurations to score per seed (heads.experiments.ensembles).
    `score_split`: the split reported in the `test_*` columns; "dev" scores few-shot heads (which select on
    nothing) on the dev slice, to choose few-shot settings without looking at test.
    `soups`: sizes K of weight soups to score per seed (heads.artefacts.soup, heads.experiments.soups; soups.json).
    `dry_run`: print the plan (heads, stacks, skipped, a rough time) and return without writing anything.
    `test_scope`: which heads are ranked on test (TEST_SCOPES); the others' test columns are empty.
    `device`: where the features and the stacks live (auto: cuda when available).
    `unlabeled`: --unlabeled files (heads.kinds.unlabeled): a positives-only pairs task's corpus and impostor pool,
    the anchor's sample; said on the terminal and in baseline.json, part of every head id."""
    combos = read_grid(grid_path)
    device = pick_device(device)
    if any(c.get("precision") == "bf16" for c in combos):  # one line where bf16 is emulated (a CPU without it)
        warn_if_emulated_bf16("bf16", device, fix=f'precision = "fp32" in {grid_path}')
    inputs = (data_path, grid_path, *transfer, *select_ood, *unlabeled)
    prepare_output_dir(out_dir, "grid", overwrite, resumable=True, inputs=inputs, create=False)
    store = FeatureStore.open(store_path)
    _check_arrays(combos, store, grid_path, store_path)
    task = load_task(data_path, store, data_format, score_range=score_range, unlabeled=unlabeled)
    unlabeled_rows = task.unlabeled.rows if task.unlabeled else None  # store rows: the anchor's sample
    unlabeled_note = grid_report(task, [split_settings(c)[1] for c in combos])  # the roles they play
    ood = _transfer_sets(task, store, transfer)
    tf = TaskFeatures.for_task(store, task, rows_of_datasets(store, select_ood), *[rows_of(t) for t in ood.values()],
                               *_anchor_rows(combos, store, unlabeled_rows), device=device)
    task, ood = tf.remap(task), tf.remap(ood)  # rows -> positions of the rows read (heads.artefacts.task_features)
    selection = load_selection(store, select_ood, task, tf.read("features")[:, :store.dim], ood_delta,
                               remap=tf.remap)
    ids = {"data": str(data_path), "fingerprint": store.fingerprint, "transfer": tuple(ood), "in_dim": store.dim,
           "score_range": task.score_range, "select_ood": tuple(selection.sets), "ood_delta": ood_delta,
           "data_format": data_format, "store_rows": store.n_texts,
           "unlabeled": unlabeled_note.get("digest")}
    if dry_run:
        done = {r["head_id"] for r in (resume_rows(out_dir, GRID_VERSION)[0] if not overwrite else [])}
        n_done = len(done)  # before plan_stacks adds the planned heads to it
        print(plan_summary(*plan_stacks(combos, task, ids, done), n_done, task, store.dim))
        return pl.DataFrame()
    if not overwrite:  # before anything is written into --out
        done = read_results(out_dir).to_dicts() if (Path(out_dir) / RESULTS_FILE).is_file() else []
        check_resumed_scope(done, test_scope, out_dir, GRID_VERSION)
    out = prepare_output_dir(out_dir, "grid", overwrite, resumable=True, inputs=inputs)  # data read: claim it
    atomic_write_text(out / "grid.toml", read_utf8(Path(grid_path)))
    rows, old_rows = resume_rows(out, GRID_VERSION)
    groups, skipped = plan_stacks(combos, task, ids, {r["head_id"] for r in rows})
    if progress:
        print(plan_summary(groups, skipped, len(rows), task, store.dim))
        if unlabeled_note:
            print(unlabeled_line(unlabeled_note))
    rows += skipped
    runner = StackRunner(out, task, tf, store_path, data_path, data_format, ood, selection, score_split, test_scope,
                         unlabeled_rows, unlabeled_note)
    bar = progress_bar(total=sum(len(items) for items in groups.values()), desc="grid heads", disable=not progress)
    modelled = plan_seconds(groups, task, store.dim)
    for i, ((_, _, array), items) in enumerate(groups.items()):
        t0, compiling = time.perf_counter(), stacked_adamw.compile_seconds
        rows += runner.train(items, array, progress)
        write_results(out, old_rows + rows)
        bar.update(len(items))
        if i == 0 and len(groups) > 1 and progress:  # the estimate again, at the pace this machine measured
            compiled = stacked_adamw.compile_seconds - compiling  # once per process: not the pace of the rest
            progress_write(pace_line(time.perf_counter() - t0 - compiled, modelled, compiled))
    bar.close()
    if rows or old_rows:
        write_results(out, old_rows + rows)
    frame = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()
    _finish(out, frame, runner, ensembles, progress)
    if soups and not frame.is_empty():
        score_soups(out, frame, runner.task, runner.features, runner.ood, runner.selection, tuple(soups),
                    transfer_split)
    return frame


def _anchor_rows(combos: list[dict], store: FeatureStore, unlabeled=None) -> list:
    """The anchor rows of every configuration with an anchor (None: the whole store), to read with the task."""
    paths = {c.get("anchor_data", "") for c in combos if c.get("anchor_weight")}
    return [anchor_rows_of(store, TrainConfig(anchor_weight=1.0, anchor_data=p), unlabeled) for p in sorted(paths)]


def _check_arrays(combos: list[dict], store: FeatureStore, grid_path: str, store_path: str) -> None:
    missing = sorted({a for c in combos for a in array_list(c.get("array", "features"))} - set(store.arrays))
    if missing:
        raise ValueError(f"{grid_path}: array {missing} not in {store_path}; its arrays: {store.arrays}")


def _transfer_sets(task: Task, store: FeatureStore, paths: tuple[str, ...]) -> dict[str, Task]:
    """The out-of-domain sets, without any item sharing a text with the in-domain dataset (counted)."""
    ood = {t.name: t for t in (load_task(p, store, for_eval=True) for p in paths)}
    in_domain = task_rows(task)
    for name in list(ood):  # an out-of-domain set never scores texts the head was trained or selected on
        ood[name], dropped = without_overlap(ood[name], in_domain)
        if any(dropped.values()):
            print(f"{name}: dropped items sharing a text with {task.name}: {dropped}")
    return ood


def why_not(task: Task, train: TrainConfig) -> str:
    """Why a configuration cannot train on the task ("" when it can): its loss does not take this kind of
    data, or the data cannot serve its settings (e.g. --hierarchy on flat labels)."""
    kind = kind_of(task)
    reason = applicable(train.loss, kind.train_form(task), task.name, task.kind)
    if reason:
        return reason
    try:
        kind.for_training(task, train)
    except ValueError as err:
        return str(err)
    return ""


def plan_stacks(combos: list[dict], task: Task, ids: dict, done: set[str]) -> tuple[dict, list[dict]]:
    """({(head shape, stack key, array): [(head id, head, train, array)]} of the heads still to train,
    rows of the combinations skipped with their reason)."""
    groups: dict[tuple, list] = {}
    skipped = []
    trained_as: dict[tuple, tuple[str, str]] = {}  # (objective, other settings) -> (head id, loss) trained
    for s in combos:
        hid = head_id(s, **ids)
        if hid in done:
            continue
        done.add(hid)
        head, train, array = split_settings(s)
        reason = why_not(task, train)
        if reason:
            skipped.append({"head_id": hid, "grid_version": GRID_VERSION, **flat_settings(head, train, array),
                            "status": "skipped", "reason": reason})
            continue
        twin = objective_key(task, head, train, array)
        if twin in trained_as:
            skipped.append(same_objective_row(hid, head, train, array, twin[0], *trained_as[twin], task))
            continue
        if twin is not None:
            trained_as[twin] = (hid, train.loss)
        key = (json.dumps(asdict(head), sort_keys=True), stack_key(train), array)
        groups.setdefault(key, []).append((hid, head, train, array))
    return groups, skipped


def same_objective_row(hid: str, head: HeadConfig, train: TrainConfig, array: str, objective_name: str,
                       twin_id: str, twin_loss: str, task: Task) -> dict:
    """The results row of a configuration not trained because `twin_id` (loss `twin_loss`) trains the same heads."""
    form = kind_of(task).train_form(task)
    return {"head_id": hid, "grid_version": GRID_VERSION, **flat_settings(head, train, array),
            "status": "same-objective", "same_as": twin_id,
            "reason": f"{train.loss} trains what {twin_loss} trains on {form} pairs under --graded {train.graded} "
                      f"({objective_name}): trained once, as {twin_loss} (same_as: its head id)"}


def objective_key(task: Task, head: HeadConfig, train: TrainConfig, array: str) -> tuple | None:
    """(the shared objective, every other setting) of a configuration whose loss reduces on this task's data to
    an objective other losses reduce to too (heads.scoring.losses.objective); None when it trains its loss's own."""
    kind = kind_of(task)
    form = kind.train_form(task)
    if objective(train.loss, form, train.graded, negatives=False) == train.loss:
        return None  # reduces to nothing shared on this form, whatever the negatives
    negatives = (kind.train_set(task, train.loss).negative is not None  # given, or mined from an IR corpus
                 or bool(train.mined_k and LOSSES[train.loss].negatives and task.corpus_rows is not None))
    name = objective(train.loss, form, train.graded, negatives)
    if name == train.loss:
        return None
    rest = {k: v for k, v in train.to_dict().items() if k != "loss"}
    return name, json.dumps(asdict(head), sort_keys=True), json.dumps(rest, sort_keys=True, default=str), array


def plan_summary(groups: dict, skipped: list[dict], n_done: int, task: Task, store_dim: int) -> str:
    """One paragraph on what a grid will do: heads and stacks to train, skipped and finished ones, configurations
    trained once for two losses (the same objective), a rough time (heads.experiments.grid_estimate)."""
    n_heads = sum(len(items) for items in groups.values())
    same = [r for r in skipped if r["status"] == "same-objective"]
    lines = [f"grid plan: {n_heads} head(s) to train in {len(groups)} stack(s); {len(skipped) - len(same)} skipped "
             f"(cannot apply); {n_done} already finished (resumed)"]
    if same:
        lines.append(f"  trained once: {len(same)} configuration(s) train the very same heads as another loss's "
                     f"({same[0]['reason']}); recorded as same-objective")
    if n_heads:
        rough = sum(plan_seconds(groups, task, store_dim))
        lines.append(f"  rough time on a 2-core CPU: {rough / 60:.1f} min (every epoch run; early stopping shortens "
                     "it; measured again after the first stack)")
    for (_, _, array), items in list(groups.items())[:10]:
        first = items[0][2]
        lines.append(f"  stack of {len(items)}: loss {first.loss}, array {array}, epochs {first.epochs}")
    if len(groups) > 10:
        lines.append(f"  ... and {len(groups) - 10} more stacks")
    lines += [f"  skipped: {r['reason']}" for r in skipped if r["status"] != "same-objective"][:5]
    for shots in sorted({it[2].shots for items in groups.values() for it in items if it[2].shots}):
        clipped = shots_clipped(task, shots)  # more shots than a class has: said, as train-head says it
        if clipped:
            lines.append(f"  note: {shots_note(shots, clipped)}")
    return "\n".join(lines)


def flat_settings(head: HeadConfig, train: TrainConfig, array: str) -> dict:
    """A row's settings; those added since grid rows were first recorded (the levers of issue 20) only
    where set, so the rows (and golden outputs) of grids that do not use them keep their columns."""
    h = {k: v for k, v in asdict(head).items() if k != "in_dim" and UNSET_SINCE_ID.get(k, object()) != v}
    t = {k: v for k, v in train.to_dict().items() if UNSET_SINCE_ID.get(k, object()) != v}
    return {**h, **t, "array": array}


def transfer_split(task: Task) -> str:
    """The split an out-of-domain dataset is scored on: test, else the whole table, else its first split."""
    return next((s for s in ("test", WHOLE) if s in task.eval_sets), next(iter(task.eval_sets)))


def _finish(out: Path, frame: pl.DataFrame, runner: "StackRunner", ensembles: tuple[int, ...], progress: bool) -> None:
    """baseline.json, the ensembles, the leaderboard and the seed summary of everything trained."""
    baselines = runner.baselines or {"features": runner.baseline("features")}
    for b in baselines.values():
        if runner.selection:
            b["selection"] = runner.selection.describe()
        if runner.unlabeled_note:
            b["unlabeled"] = runner.unlabeled_note
    atomic_write_json(out / "baseline.json", baselines)
    ens_rows = []
    if ensembles and not frame.is_empty():
        arrays = {a: runner.features(a) for a in frame.filter(pl.col("status") == "ok")["array"].unique().to_list()}
        ens_rows, per_seed = score_ensembles(out, frame, runner.task, arrays, runner.ood, runner.selection,
                                             tuple(ensembles), transfer_split)
        write_ensembles(out, ens_rows, per_seed)
    write_report(frame, runner.task, baselines, out, print_it=progress, ensembles=ens_rows)
    write_summary(frame, runner.task, out, print_it=progress)


class StackRunner:
    """Trains one stack of a grid and scores it: features and frozen baselines cached per array (and per
    training set, for few-shot stacks), each stack saved loadably, one results row per head."""

    def __init__(self, out: Path, task: Task, tf: TaskFeatures, store_path: str, data_path: str,
                 data_format: str | None, ood: dict[str, Task], selection: OodSelection, score_split: str,
                 test_scope: str = "auto", unlabeled_rows=None, unlabeled_note: dict | None = None):
        self.out, self.task, self.tf, self.ood, self.selection = out, task, tf, ood, selection
        self.unlabeled_rows, self.unlabeled_note = unlabeled_rows, unlabeled_note or {}  # store rows; its report
        self.store = tf.store
        self.context = {"data": str(data_path), "format": data_format, "store": str(store_path)}
        self.score_split = score_split
        if test_scope not in TEST_SCOPES:
            raise ValueError(f"test scope {test_scope!r}; valid: {sorted(TEST_SCOPES)}")
        self.test_scope = test_scope
        self.baselines: dict[str, dict] = {}  # per array: frozen features on dev/test (and transfer sets)
        self._base_rows: dict[tuple, dict] = {}  # per (array, training set): frozen test metrics, `base_*`

    def features(self, array: str) -> torch.Tensor:
        return self.tf.read(array)  # the rows the grid's tasks use, read once per array

    def anchor_positions(self, cfg: TrainConfig):
        """The anchor's rows (heads.training.anchor) as positions of the features read (None: every row)."""
        rows = anchor_rows_of(self.store, cfg, self.unlabeled_rows)
        return None if rows is None else self.tf.positions(rows)

    def baseline(self, array: str) -> dict:
        """Frozen features with cosine and L1: metrics and per-item values on dev and test (and OOD sets)."""
        X = self.features(array)[:, :self.store.dim]  # the first array (the last layer)
        out = {}
        for name, t in self.ood.items():
            res, _ = evaluate_split(t, transfer_split(t), embedder(None, X), ("cosine", "l1"))
            out[f"ood_{name}"] = {"metrics": res[0]}
        for split in ("dev", "test"):
            if split in self.task.eval_sets:
                res, items = evaluate_split(self.task, split, embedder(None, X), ("cosine", "l1"))
                out[split] = {"metrics": res[0], "items": {k: [float(x) for x in v] for k, v in items[0].items()}}
        return out

    def scored_task(self, train: TrainConfig) -> Task:
        """The task a stack trains on (the kind's `for_training`) with the split reported as test."""
        stask = kind_of(self.task).for_training(self.task, train)
        if self.score_split == "test":
            return stask
        if not train.shots:
            raise ValueError(f"score_split={self.score_split!r} is for few-shot heads (shots > 0), which select on nothing")
        report = kind_of(self.task).as_reported(self.task.eval_sets[self.score_split])
        return replace(stask, eval_sets={"test": report})

    def base_columns(self, stask: Task, array: str, key: tuple) -> dict:
        """`base_*`: the frozen baseline on the texts a stack trained on, when they differ from the dataset's
        (few-shot samples): every head is compared with the baseline that saw exactly its labels."""
        if stask is self.task:
            return {}
        if key not in self._base_rows:
            X = self.features(array)[:, :self.store.dim]
            res, _ = evaluate_split(stask, "test", embedder(None, X), ("cosine", "l1"))
            self._base_rows[key] = {f"base_{k}": v for k, v in res[0].items()}
        return self._base_rows[key]

    def train(self, items: list[tuple], array: str, progress: bool) -> list[dict]:
        """Train one stack, save it, and return its rows."""
        X = self.features(array)
        if array not in self.baselines:
            self.baselines[array] = self.baseline(array)
        configs = [it[2] for it in items]
        stask = self.scored_task(configs[0])
        head_cfg = head_shape(items[0][1], X, array, stask, configs[0])  # a classifier head ends in the classes
        t0 = time.perf_counter()
        model, norm, runs = train_stack(stask, X, head_cfg, configs, progress=progress, selection=self.selection,
                                        anchor_rows=self.anchor_positions(configs[0]))
        t1 = time.perf_counter()
        scores, tested = self.score(stask, model, norm(X), configs[0].eval_energy, runs, configs)
        t2 = time.perf_counter()
        stack = items[0][0]
        save_stack(self.out, stack, model, norm, [it[0] for it in items], configs, array, self.stack_context(stask))
        base = self.base_columns(stask, array, (array, configs[0].shots, configs[0].seed if configs[0].shots else 0))
        extra = kind_of(stask).grid_columns(stask)
        rows = []
        for h, (hid, head, train, _) in enumerate(items):
            row = {"head_id": hid, "grid_version": GRID_VERSION, "stack": stack, "stack_index": h,
                   **flat_settings(head, train, array), "status": runs[h].status, "reason": runs[h].reason,
                   "best_epoch": runs[h].best_epoch, "train_seconds": (t1 - t0) / len(items),
                   "eval_seconds": (t2 - t1) / len(items), "history": json.dumps(runs[h].history), **extra}
            if train.strength != "1":  # the a applied after training, and the dev curve it was chosen on
                row.update(strength_chosen=runs[h].strength, strength_curve=json.dumps(runs[h].strength_curve))
            row.update(dev_ranked=runs[h].dev_candidates.get("method", "exact") if runs[h].dev_candidates else "exact",
                       test_scored=h in tested, test_scope=self.test_scope)
            rows.append(row | self.score_columns(scores, h, stask, configs[0].eval_energy) | base)
        return rows

    def score(self, stask: Task, model, Xn: torch.Tensor, energy: str, runs: list, configs: list) -> tuple[dict, set]:
        """({column prefix: (metrics per head, items per head)} on dev, test and the transfer sets, and the
        out-of-domain selection losses under "sel"; the heads scored on test). A stack whose dev was ranked on
        candidates (a corpus above exact_max, heads.kinds.ir.selection_set) reports that dev, and with
        test_scope "auto" ranks test exactly over the corpus for the heads of its dev-best configuration only
        (TEST_SCOPES)."""
        embed = embedder(model, Xn)
        cut = runs[0].select_set is not None and runs[0].dev_candidates.get("method") == "candidates"
        dev_task = replace(stask, eval_sets={**stask.eval_sets, "dev": runs[0].select_set}) if cut else stask
        scores = {"dev": evaluate_split(dev_task, "dev", embed, (energy,))} if "dev" in stask.eval_sets else {}
        for name, t in self.ood.items():
            scores[f"ood_{name}"] = evaluate_split(t, transfer_split(t), embed, (energy,))
        if self.selection:
            scores["sel"] = self.selection.losses(embed, energy)
        tested: set[int] = set()
        if "test" in stask.eval_sets:
            tested = heads_to_test(self.test_scope, cut, scores, runs, configs, kind_of(stask).primary_metric(energy),
                                   self.selection.delta if self.selection else 0.0)
            scores["test"] = scored_heads(stask, "test", model, Xn, energy, sorted(tested))
        order = ["dev", "test", *(f"ood_{name}" for name in self.ood), "sel"]  # the columns' order
        return {k: scores[k] for k in order if k in scores}, tested

    def score_columns(self, scores: dict, h: int, stask: Task, energy: str) -> dict:
        row = {"primary": kind_of(stask).primary_metric(energy)}
        for split, (per_head, per_item) in scores.items():
            if split == "sel" or per_head[h] is None:  # not scored (test: another configuration was selected)
                continue
            kind = kind_of(self.ood[split[4:]] if split.startswith("ood_") else stask)
            row.update({f"{split}_{k}": v for k, v in per_head[h].items()})
            row[f"{split}_primary"] = per_head[h][kind.primary_metric(energy)]
            row[f"{split}_items"] = json.dumps([float(x) for x in per_item[h][PREFIX[energy]]])
        if "sel" in scores:
            sel_loss, sel_sets = scores["sel"]
            row.update({f"sel_{n}_primary": float(v[h]) for n, v in sel_sets.items()})
            row["sel_loss"], row["sel_delta"] = float(sel_loss[h]), float(self.selection.delta)
        return row

    def stack_context(self, stask: Task) -> dict:
        """What a head needs to know of its dataset and store (train-head's config.json fields), per stack."""
        return {**self.context, "task": stask.name, "kind": stask.kind,
                "dev": stask.dev_note or "the dataset's dev split", "store_fingerprint": self.store.fingerprint,
                "store_manifest": {k: v for k, v in self.store.manifest.items() if k != "arrays"}, **label_space(stask)}
