"""`cli grid`: train every combination of a TOML grid of head settings, stacked by shape, for every task kind.

The grid file and head ids: heads.experiments.grid.spec; the plan (stacks; skipped and same-objective rows):
heads.experiments.grid.plan; the inputs, read once: heads.experiments.grid.inputs. On labelled texts `shots` and
`seed` are ordinary keys (a few-shot stack trains on the texts its seed draws, the kind's `for_training`), and
each row carries the frozen baseline of the texts it trained on (`base_*`). Results are written after every
stack, so a rerun into the same output skips finished heads and a changed grid trains only what is new; every
head is saved loadably (`GRID#rank=K`, `GRID#id=HEAD_ID`, heads.artefacts.files).

Engines: `local` trains the stacks one after another in this process, `ray` on a Ray cluster's workers
(heads.experiments.grid.ray_engine). Either way `StackRunner.compute` trains and scores a stack (nothing written) and
this process alone saves it (`StackRunner.save`, then results.parquet, rows in the plan's order): a stack's
training and scoring is heads.experiments.grid.stack.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import polars as pl

from headstore.data.progress import progress_bar, progress_write
from headstore.data.files import atomic_write_json, atomic_write_text
from headstore.data.outputs import prepare_output_dir
from headstore.data.tables import read_utf8
from headstore.featurize.encoder.hardware import warn_if_emulated_bf16
from headstore.featurize.encoder.model import pick_device
from headstore.heads.artefacts.files import RESULTS_FILE, read_results, resume_rows, write_results
from headstore.heads.artefacts.judged import write_judgements
from headstore.heads.experiments.grid.ensembles import score_ensembles, write_ensembles
from headstore.heads.experiments.grid.estimate import pace_line, plan_seconds
from headstore.heads.experiments.grid.inputs import load_inputs, transfer_split
from headstore.heads.experiments.grid.plan import of_this_grid, plan_stacks, plan_summary
from headstore.heads.experiments.grid.ray_engine import ray_ready, train_on_ray
from headstore.heads.experiments.grid.scope import check_resumed_scope
from headstore.heads.experiments.grid.spec import GRID_VERSION, read_grid
from headstore.heads.experiments.grid.stack import StackRunner
from headstore.heads.experiments.grid.leaderboard import write_report
from headstore.heads.experiments.grid.soups import score_soups
from headstore.heads.experiments.grid.summary import write_summary
from headstore.heads.kinds.unlabeled import unlabeled_line
from headstore.heads.training.selection import DEFAULT_DELTA

ENGINES = ("local", "ray")  # local: this process, one stack after another; ray: heads.experiments.grid.ray_engine


def run_grid(store_path: str, data_path: str, grid_path: str, out_dir: str, data_format: str | None = None,
             progress: bool = True, transfer: tuple[str, ...] = (), score_range=None,
             overwrite: bool = False, select_ood: tuple[str, ...] = (), ood_delta: float = DEFAULT_DELTA,
             ensembles: tuple[int, ...] = (), score_split: str = "test", dry_run: bool = False,
             soups: tuple[int, ...] = (), test_scope: str = "auto", device: str = "auto",
             unlabeled: tuple[str, ...] = (), engine: str = "local", ray_options=None, precision=None) -> pl.DataFrame:
    """Train every head of the grid (skipping finished ones); write results, leaderboard, summary and plots.

    `transfer`: out-of-domain datasets (texts in the store) every head is also scored on, never
    trained or selected on: columns `ood_<name>_primary` (and the frozen baseline's in baseline.json);
    a transfer table without a split column is scored whole. `score_range`: an STS table's scale (default: detected).
    `select_ood`: out-of-domain datasets whose dev (else train) split takes part in selection, epochs and
    configurations alike (heads.training.selection; `ood_delta` its tolerance); columns `sel_<name>_primary`, `sel_loss`.
    `ensembles`: sizes K of ensembles of the best configurations to score per seed (heads.experiments.grid.ensembles).
    `score_split`: the split reported in the `test_*` columns; "dev" scores few-shot heads (which select on
    nothing) on the dev slice, to choose few-shot settings without looking at test.
    `soups`: sizes K of weight soups to score per seed (heads.artefacts.soup, heads.experiments.grid.soups; soups.json).
    `dry_run`: print the plan (heads, stacks, skipped, a rough time) and return without writing anything.
    `test_scope`: which heads are ranked on test (TEST_SCOPES); the others' test columns are empty. `device`: where
    the features and the stacks live (auto: cuda when available; on the ray engine see RayOptions).
    `unlabeled`: --unlabeled files (heads.kinds.unlabeled): a positives-only pairs task's corpus and impostor pool, the
    anchor's sample; said on the terminal and in baseline.json, part of every head id.
    `engine`: ENGINES; `ray_options`: heads.experiments.grid.ray_engine.RayOptions (None: its defaults); `precision`:
    every head's training maths (fp32 | bf16), where the grid file does not set another."""
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}; valid: {', '.join(ENGINES)}")
    combos = read_grid(grid_path, precision)
    where = pick_device(device) if engine == "local" else "cpu"  # ray: this process's copy; the workers' elsewhere
    if engine == "ray" and not dry_run:  # Ray joined, a stack's resources found: before anything is written
        ray_options = ray_ready(ray_options, device)
    if any(c.get("precision") == "bf16" for c in combos):  # one line where bf16 is emulated (a CPU without it)
        warn_if_emulated_bf16("bf16", where, fix=f'precision = "fp32" in {grid_path}')
    inputs = (data_path, grid_path, *transfer, *select_ood, *unlabeled)
    prepare_output_dir(out_dir, "grid", overwrite, resumable=True, inputs=inputs, create=False)
    g = load_inputs(combos, store_path, data_path, grid_path, data_format, transfer, select_ood, ood_delta,
                    score_range, unlabeled, where)
    if dry_run:
        print(_dry_run_plan(combos, g, out_dir, overwrite))
        return pl.DataFrame()
    if not overwrite:  # before anything is written into --out
        done = read_results(out_dir).to_dicts() if (Path(out_dir) / RESULTS_FILE).is_file() else []
        check_resumed_scope(done, test_scope, out_dir, GRID_VERSION)
    out = prepare_output_dir(out_dir, "grid", overwrite, resumable=True, inputs=inputs)  # data read: claim it
    atomic_write_text(out / "grid.toml", read_utf8(Path(grid_path)))
    write_judgements(out, g.store, g.judged)  # every head's training judgements: its eval splits seen / unseen
    rows, old_rows = _resumed(out, combos, g)
    groups, skipped = plan_stacks(combos, g.task, g.ids, {r["head_id"] for r in rows})
    if progress:
        print(plan_summary(groups, skipped, len(rows), g.task, g.store.dim))
        if g.unlabeled_note:
            print(unlabeled_line(g.unlabeled_note))
    rows += [r | {"made_of": g.made_of} for r in skipped]
    runner = StackRunner(out, g.task, g.tf, store_path, data_path, data_format, g.ood, g.selection, score_split,
                         test_scope, g.anchors, g.unlabeled_note)
    rows += _train_stacks(runner, groups, stale(old_rows) + rows, progress, engine, ray_options, g.made_of)
    if rows or old_rows:
        write_results(out, stale(old_rows) + [r | {"aggregated": True} for r in rows])
    frame = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()
    _finish(out, frame, runner, ensembles, soups, progress, g.transfer_dropped)
    return frame


def _resumed(out: Path, combos: list[dict], g) -> tuple[list[dict], list[dict]]:
    """(the rows of --out this run resumes, the rows it keeps in the file but never aggregates: another grid format,
    other datasets' contents or recipe, or heads this grid does not define)."""
    rows, old_rows = resume_rows(out, GRID_VERSION, g.made_of)
    rows, elsewhere = of_this_grid(rows, combos, g.ids, str(out / RESULTS_FILE))
    return rows, old_rows + elsewhere


def stale(rows: list[dict]) -> list[dict]:
    """Rows kept in results.parquet but not this run's: marked so that no ranking (GRID#rank=K) counts them."""
    return [r | {"aggregated": False} for r in rows]


def _dry_run_plan(combos: list[dict], g, out_dir: str, overwrite: bool) -> str:
    """`--dry-run`'s plan (heads, stacks, skipped, a rough time) of the heads not in `out_dir` yet (all of them
    with `overwrite`); nothing written."""
    done = {r["head_id"] for r in (resume_rows(out_dir, GRID_VERSION, g.made_of)[0] if not overwrite else [])}
    n_done = len(done)  # before plan_stacks adds the planned heads to it
    return plan_summary(*plan_stacks(combos, g.task, g.ids, done), n_done, g.task, g.store.dim)


def _train_stacks(runner: StackRunner, groups: dict, before: list[dict], progress: bool, engine: str,
                  ray_options, made_of: str) -> list[dict]:
    """Train the plan's stacks on `engine`; after each, its files and results.parquet (`before`, then the rows of
    the stacks finished, in the plan's order, each with `made_of`: the datasets' contents and the recipe). Returns
    those rows."""
    finished: dict[int, list[dict]] = {}
    bar = progress_bar(total=sum(len(items) for items in groups.values()), desc="grid heads", disable=not progress)

    def record(i: int, rows: list[dict]) -> None:
        finished[i] = [r | {"made_of": made_of, "aggregated": True} for r in rows]
        write_results(runner.out, before + [r for k in sorted(finished) for r in finished[k]])
        bar.update(len(rows))

    try:
        if engine == "ray":
            train_on_ray(runner, groups, lambda i, result: record(i, runner.save(result)), ray_options, progress)
        else:
            _train_local(runner, groups, record, progress)
    finally:
        bar.close()
    return [r for k in sorted(finished) for r in finished[k]]


def _train_local(runner: StackRunner, groups: dict, record: Callable[[int, list[dict]], None], progress: bool):
    """The local engine: the stacks one after another in this process; the pace measured after the first."""
    modelled = plan_seconds(groups, runner.task, runner.store.dim)
    for i, ((_, _, array), items) in enumerate(groups.items()):
        t0 = time.perf_counter()
        record(i, runner.train(items, array, progress))
        if i == 0 and len(groups) > 1 and progress:  # the estimate again, at the pace this machine measured
            progress_write(pace_line(time.perf_counter() - t0, modelled))


def _finish(out: Path, frame: pl.DataFrame, runner: StackRunner, ensembles: tuple[int, ...], soups: tuple[int, ...],
            progress: bool, transfer_dropped: dict | None = None) -> None:
    """baseline.json, the ensembles, the leaderboard, the seed summary and the soups of everything trained."""
    baselines = runner.baselines or {"features": runner.baseline("features")}
    for b in baselines.values():
        if runner.selection:
            b["selection"] = runner.selection.describe()
        if runner.unlabeled_note:
            b["unlabeled"] = runner.unlabeled_note
        if transfer_dropped:  # out-of-domain items whose text the heads trained on (heads.kinds.without_seen)
            b["transfer_dropped"] = transfer_dropped
    atomic_write_json(out / "baseline.json", baselines)
    ens_rows = []
    if ensembles and not frame.is_empty():
        arrays = {a: runner.features(a) for a in frame.filter(pl.col("status") == "ok")["array"].unique().to_list()}
        ens_rows, per_seed = score_ensembles(out, frame, runner.task, arrays, runner.ood, runner.selection,
                                             tuple(ensembles), transfer_split)
        write_ensembles(out, ens_rows, per_seed)
    write_report(frame, runner.task, baselines, out, print_it=progress, ensembles=ens_rows)
    write_summary(frame, runner.task, out, print_it=progress)
    if soups and not frame.is_empty():
        score_soups(out, frame, runner.task, runner.features, runner.ood, runner.selection, tuple(soups),
                    transfer_split)
