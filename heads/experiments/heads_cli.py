"""`cli train-head`, `cli eval` and `cli grid`: thin click layers over heads.training.run and
heads.experiments.grid.run (registered on the main group in cli.py), and the options they share."""
from __future__ import annotations

import click

from headstore.data.options import (PATH, fold_label_options, format_option, label_options, score_range_option,
                                    unlabeled_option)
from headstore.featurize.encoder.config import DEVICES
from headstore.heads.settings.config import TEST_SCOPES
from headstore.heads.settings.options import configs_from_options, head_and_train_options
from headstore.heads.settings.taps import TapSelectConfig
from headstore.heads.settings.train_sections import PRECISIONS


def select_ood_options(f):
    """--select-ood D (repeatable) and --ood-delta: out-of-domain dev splits in the selection rule."""
    f = click.option("--ood-delta", type=float, default=0.01, show_default=True,
                     help="Largest out-of-domain dev loss (frozen cosine minus head) a selected head may have.")(f)
    return click.option("--select-ood", type=PATH, multiple=True,
                        help="Out-of-domain dataset whose dev split (else train split, never test) takes part in "
                             "selection: the best dev head within --ood-delta of the frozen baseline on it, else "
                             "the least-losing (repeatable).")(f)


overwrite_option = click.option(
    "--overwrite", is_flag=True,
    help="Replace what --out already holds (a head, an eval, a grid); a feature store is never replaced.")

def memory_option(help_text: str):
    """--memory/--no-memory: the document memory (heads.training.memory_use); unset = auto."""
    return click.option("--memory/--no-memory", "memory", default=None, help=help_text)


def memory_setting(flag: bool | None) -> str:
    return {None: "auto", True: "on", False: "off"}[flag]


def lexical_option(help_text: str):
    """--lexical/--no-lexical: BM25 fused with the dense scores (heads.training.lexical_fit); unset = auto."""
    return click.option("--lexical/--no-lexical", "lexical", default=None, help=help_text)


heads_device_option = click.option(
    "--device", type=click.Choice(DEVICES), default="auto", show_default=True,
    help="Where the task's features and the heads live while training and evaluating (auto: cuda when available).")


@click.command("train-head")
@click.option("--store", type=PATH, required=True, help="Feature store written by `cli featurize`.")
@click.option("--data", type=PATH, required=True, help="Dataset (BEIR folder, STS or pairs table) whose texts are in the store.")
@format_option
@unlabeled_option
@click.option("--out", type=PATH, required=True, help="Output directory for head.safetensors, config.json, metrics.json, curve.png.")
@click.option("--array", default="features", show_default=True, help="Store array (another layer) to train on.")
@select_ood_options
@score_range_option
@overwrite_option
@heads_device_option
@memory_option("The document memory (docs/memory.md): the judged documents' vectors moved toward their training "
               "queries, strength chosen on dev, saved as memory.safetensors. Default: on for IR data with training "
               "judgements where dev keeps it; --no-memory: off; --memory: required (an error without judgements).")
@lexical_option("BM25 over the corpus's texts fused with the head's scores (docs/memory.md#lexical-fusion): its weight "
                "and the memory's gain chosen on dev, saved as lexical.json. Default: on for IR data where dev keeps "
                "it (bm25s installed, corpus up to 200,000 documents); --no-lexical: off; --lexical: required.")
@head_and_train_options
@label_options
def train_head_command(store, data, data_format, unlabeled, out, array, select_ood, ood_delta, score_range,
                       overwrite, device, memory, lexical, **settings):
    """Train one siamese energy head on stored features: train on train, select on dev, report test once."""
    from headstore.heads.training.run import train_head as run_train_head

    head_cfg, cfg, unset, label_settings = configs_from_options(settings)  # unset: left to the data's kind
    data_format = fold_label_options(data_format, label_settings)
    metrics = run_train_head(store, data, out, head_cfg, cfg, data_format, array, score_range=score_range,
                             overwrite=overwrite, select_ood=tuple(select_ood), ood_delta=ood_delta,
                             kind_defaults=unset, device=device, unlabeled=tuple(unlabeled),
                             memory=memory_setting(memory), lexical=memory_setting(lexical))
    _echo_metrics(metrics, out)


def _echo_metrics(metrics: dict, out: str) -> None:
    """A short table on the terminal (baseline vs head per split); the full JSON is in OUT's files."""
    from headstore.heads.artefacts.summary import metrics_table

    from headstore.heads.training.lexical_fit import lexical_line
    from headstore.heads.training.memory_use import memory_line

    click.echo(metrics_table(metrics))
    if metrics.get("memory"):
        click.echo(memory_line(metrics["memory"]))
    if metrics.get("lexical"):
        click.echo(lexical_line(metrics["lexical"]))
    click.echo(f"full metrics: {out}/metrics.json")
    warning = metrics.get("guard", {}).get("warning")
    if warning:
        bar = "!" * 78
        click.secho(f"{bar}\nWARNING: {warning}\n{bar}", fg="red", bold=True, err=True)


@click.command("eval")
@click.option("--store", type=PATH, required=True, help="Feature store holding the dataset's texts.")
@click.option("--head", "head_dir", type=PATH, required=True, help="A `cli train-head --out` directory.")
@click.option("--data", type=PATH, required=True, help="Dataset to evaluate on (its test split; a table without a split column whole).")
@format_option
@unlabeled_option
@click.option("--out", type=PATH, required=True, help="Directory for metrics.json.")
@click.option("--exclude-overlap", type=PATH, default=None,
              help="Dataset whose texts must not be scored (drop evaluation items that use them), e.g. the training set.")
@score_range_option
@overwrite_option
@heads_device_option
@memory_option("Apply the head's document memory (memory.safetensors) to the documents it knows. Default: where the "
               "head folder has one; --no-memory: the head alone; --memory: required.")
@lexical_option("Fuse BM25 over this dataset's corpus with the head's scores at the weight in the head folder's "
                "lexical.json. Default: where the head folder has one; --no-lexical: the dense ranking; --lexical: "
                "required.")
@label_options
def eval_command(store, head_dir, data, data_format, unlabeled, out, exclude_overlap, score_range, overwrite,
                 device, memory, lexical, **label_settings):
    """Evaluate a trained head (and the frozen baseline beside it) on any dataset whose texts are in the store.

    Scores the dataset's test split; a table without a split column is scored whole."""
    from headstore.heads.training.eval_run import eval_head

    data_format = fold_label_options(data_format, label_settings)
    metrics = eval_head(store, head_dir, data, out, data_format, exclude_overlap, score_range=score_range,
                        overwrite=overwrite, device=device, unlabeled=tuple(unlabeled),
                        memory=memory_setting(memory), lexical=memory_setting(lexical))
    _echo_metrics(metrics, out)


@click.command("grid")
@click.option("--store", type=PATH, required=True, help="Feature store written by `cli featurize`.")
@click.option("--data", type=PATH, required=True, help="Dataset whose texts are in the store.")
@format_option
@unlabeled_option
@click.option("--grid", "grid_path", type=PATH, required=True, help="TOML grid file ([grid] lists, [fixed] values).")
@click.option("--out", type=PATH, required=True, help="Results directory (rerunning into it skips finished heads).")
@click.option("--transfer", type=PATH, multiple=True, help="Out-of-domain dataset every head is also scored on (repeatable).")
@select_ood_options
@click.option("--dry-run", is_flag=True, help="Print the plan (heads, stacks, skipped, a rough time) and exit.")
@click.option("--ensemble", "ensembles", multiple=True, type=click.IntRange(min=1),
              help="Also score ensembles (mean L1 energy) of the K best l1 configurations, one per seed (repeatable).")
@click.option("--soup", "soups", multiple=True, type=click.IntRange(min=1),
              help="Also score soups (mean weights) of K heads sharing their start, one per seed (repeatable; "
                   "GRID#soup=K loads one).")
@heads_device_option
@click.option("--precision", type=click.Choice(PRECISIONS), default=None,
              help="Every head's training maths: fp32, or bf16 autocast for the matmuls (native on a CPU with "
                   "avx512_bf16 or AMX; emulated and slow elsewhere, said in one line); default: the grid file's "
                   "precision, else fp32. A file that sweeps or fixes another precision is an error.")
@click.option("--test-scope", type=click.Choice(TEST_SCOPES), default="auto", show_default=True,
              help="Heads ranked on test: all; selected (each stack's dev-best configuration, every seed); auto: "
                   "all, but selected where dev was ranked on candidates (an IR corpus above --exact-max documents).")
@score_range_option
@overwrite_option
@label_options
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: this process trains the stacks one after another; ray: each stack a task on a Ray "
                   "cluster's workers, the features shared once per node (pip install '.[ray]'; docs/guide/gpu-ray.md).")
@click.option("--address", default=None,
              help="--engine ray: the Ray cluster to join ('auto': the one running here, or HOST:PORT; default: "
                   "start a local Ray).")
@click.option("--cpus-per-stack", type=int, default=1, show_default=True,
              help="--engine ray: CPUs a stack asks for, and its torch threads.")
@click.option("--gpus-per-stack", type=float, default=None,
              help="--engine ray: GPUs a stack asks for (default: 1 with --device cuda, or auto on a cluster with "
                   "GPUs; else 0; 0.5: two stacks share a GPU).")
def grid_command(store, data, data_format, unlabeled, grid_path, out, transfer, select_ood, ood_delta, dry_run,
                 ensembles, soups, device, precision, test_scope, score_range, overwrite, engine, address,
                 cpus_per_stack, gpus_per_stack, **label_settings):
    """Train every combination of a grid of heads (stacked by shape); write results, leaderboard and plots.

    On labelled texts (--format labels) the grid may sweep shots, hierarchy and per_class; each few-shot
    head is scored beside the frozen probe and k-NN on the same labelled texts (docs/labels.md)."""
    from headstore.heads.experiments.grid.run import run_grid
    from headstore.heads.experiments.grid.ray_engine import RayOptions

    data_format = fold_label_options(data_format, label_settings)
    if engine == "local" and (address or cpus_per_stack != 1 or gpus_per_stack is not None):
        raise click.BadParameter("--address, --cpus-per-stack and --gpus-per-stack are for --engine ray",
                                 param_hint="--engine")
    ray_options = RayOptions(address, cpus_per_stack, gpus_per_stack)
    run_grid(store, data, grid_path, out, data_format, transfer=tuple(transfer), score_range=score_range,
             overwrite=overwrite, select_ood=tuple(select_ood), ood_delta=ood_delta, ensembles=tuple(ensembles),
             dry_run=dry_run, soups=tuple(soups), test_scope=test_scope, device=device, unlabeled=tuple(unlabeled),
             engine=engine, ray_options=ray_options, precision=precision)


@click.command("select-taps")
@click.option("--store", type=PATH, required=True, help="A store featurized with --taps.")
@click.option("--data", type=PATH, required=True, help="Dataset whose training pairs choose the taps (dev and test unread).")
@format_option
@click.option("--first", default="features", show_default=True, help="The array the head reads first, always kept.")
@click.option("--keep", type=int, default=TapSelectConfig.keep, show_default=True, help="Taps kept beside --first.")
@click.option("--penalty", type=float, default=TapSelectConfig.penalty, show_default=True, help="Group-lasso strength.")
@click.option("--rank", type=int, default=TapSelectConfig.rank, show_default=True, help="Width of the linear map.")
@click.option("--epochs", type=int, default=TapSelectConfig.epochs, show_default=True)
@click.option("--lr", type=float, default=TapSelectConfig.lr, show_default=True,
              help="SGD's step; refused where the fit falls (lower it for many or heavy-tailed taps).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=PATH, default=None, help="JSON file for every tap's score and the chosen --array.")
def select_taps_command(store, data, data_format, first, keep, penalty, rank, epochs, lr, seed, out):
    """Rank a store's taps by a group lasso on the training pairs; print the --array a head should read."""
    from headstore.heads.experiments.taps.selection import select_taps, selection_table

    cfg = TapSelectConfig(penalty=penalty, rank=rank, epochs=epochs, lr=lr, keep=keep, seed=seed)
    click.echo(selection_table(select_taps(store, data, cfg, first, data_format, out)))
