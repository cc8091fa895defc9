"""headstore command line: one click group, each command a thin layer over one library call.

Bad input (a ValueError such as DataError or StoreError, a missing file, a refused path) is shown as one
line, `Error: path:line/row: problem (what to do)`, with exit code 2 and no traceback; `cli --debug ...`
shows the traceback. Anything else is a bug and keeps its traceback. docs/bad-input.md lists the cases.
"""

from __future__ import annotations

import errno
import json
import math
import os
import sys

# The command line's process is its own: these settings are made here, for good, before anything imports
# torch or polars (their runtimes read them at load, so they cannot be scoped; the library never sets them).
# A value the user set is kept. Measured on a 2-core machine:
# - OMP_WAIT_POLICY=PASSIVE: OpenMP threads that reach a barrier sleep instead of spinning. On a CPU shared
#   with other busy processes, spinning waiters keep the one thread that still has work off its core; at
#   load ~4, MiniLM forwards were 1.7-25x faster (the smaller the batch, the larger the gain); same numbers.
# - THP_MEM_ALLOC_ENABLE=1: torch's CPU allocator asks for transparent huge pages for blocks of 2 MB and more;
#   a 64-head grid over 100k documents spent 127 s instead of 239 s in the kernel and trained 15% faster
#   (3 epochs: 310 s vs 367 s), peak RSS 5.7 vs 5.5 GB, the same numbers.
# - _RJEM_MALLOC_CONF: pages polars (built with jemalloc) frees go back to the OS at once; reading a BEIR
#   folder of 1M documents left ~140 MB of freed pages in the process (547 vs 690 MB), 3x that at 3M.
CLI_ENVIRONMENT = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "THP_MEM_ALLOC_ENABLE": "1",
    "_RJEM_MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0",
}
for _key, _value in CLI_ENVIRONMENT.items():
    os.environ.setdefault(_key, _value)

import click  # noqa: E402  (every import below may load torch or polars)

from headstore.data.dataset import FORMATS
from headstore.data.errors import SystemFailure
from headstore.featurize.backends import CHOICES as BACKEND_CHOICES
from headstore.featurize.config import DEVICES, PACKINGS, POOLING_NAMES, PRECISIONS
from headstore.data.options import PATH, fold_label_options, format_option, label_options, unlabeled_option
from headstore.heads.settings.config import TEST_SCOPES
from headstore.heads.settings.options import configs_from_options, head_and_train_options, named_as_typed
from headstore.heads.apply.tunings import TUNINGS


# exceptions that mean "the input (files, options, paths) is wrong", never "headstore has a bug"
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError,
               PermissionError)
BAD_INPUT_EXIT = 2  # as click's own usage errors


class BadInput(click.ClickException):
    """A user error as click shows it: `Error: <message>` on stderr, exit code 2."""

    exit_code = BAD_INPUT_EXIT


def user_message(err: BaseException) -> str:
    """The one-line message of a user error (an OSError from open() becomes `path: problem`)."""
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        return f"{err.filename}: {err.strerror.lower()}"
    return str(err)


SYSTEM_ERROR_EXIT = 1  # the machine failed the command (a full disk, an I/O error): the input was fine
INTERRUPTED_EXIT = 130  # 128 + SIGINT, as shells expect of a command stopped by Ctrl-C
SYSTEM_ERROR_HINTS = {  # errno -> what to do; every write is atomic, so the same command then goes on
    errno.ENOSPC: "free some space",
    errno.EDQUOT: "free some space or raise the quota",
    errno.EROFS: "the filesystem is read-only: remount it writable or give another path",
    errno.EIO: "an I/O error: check the disk or the network filesystem",
}


class SystemFault(click.ClickException):
    """An OS error of a read or write as click shows it: `Error: <path>: <OS error> (...)`, exit code 1."""

    exit_code = SYSTEM_ERROR_EXIT


def system_message(err: OSError) -> str:
    """One line naming the file and the OS error, with what to do; nothing half-written is ever committed."""
    where = f"{err.filename}: " if err.filename is not None else ""
    hint = SYSTEM_ERROR_HINTS.get(err.errno, "fix the cause")
    return (f"{where}{err.strerror or err} ({hint}, then run the same command again: what was committed "
            "is kept, nothing half-written was)")


class HeadstoreGroup(click.Group):
    """The one place user errors become messages: every command (nested groups included) runs inside
    this group's invoke, so no command needs its own try/except. An OSError that is no user error (a full
    disk, an I/O error) is one line too (exit 1); Ctrl-C exits 130 without a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except USER_ERRORS as err:
            if ctx.find_root().params.get("debug"):
                raise
            raise BadInput(user_message(err)) from None
        except (OSError, SystemFailure) as err:
            if ctx.find_root().params.get("debug"):
                raise
            raise SystemFault(system_message(err) if isinstance(err, OSError) else str(err)) from None
        except KeyboardInterrupt:
            click.echo("\ninterrupted (what was committed is kept; run the same command again to go on)", err=True)
            raise click.exceptions.Exit(INTERRUPTED_EXIT) from None


class ScoreRange(click.ParamType):
    """`LO,HI`, two finite numbers with LO < HI (the scale of an STS table's scores)."""

    name = "LO,HI"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            lo, hi = (float(v) for v in str(value).split(","))
        except ValueError:
            self.fail(f"{value!r} is not LO,HI (two numbers, e.g. 0,5)", param, ctx)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            self.fail(f"{value!r}: need finite LO < HI", param, ctx)
        return lo, hi


score_range_option = click.option(
    "--score-range", type=ScoreRange(), default=None,
    help="Scale of an STS table's scores, e.g. 0,5 (default: detected as 0-1 or 0-5); "
         "a score outside it is an error naming its row.")


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

heads_device_option = click.option(
    "--device", type=click.Choice(DEVICES), default="auto", show_default=True,
    help="Where the task's features and the heads live while training and evaluating (auto: cuda when available).")


@click.group(cls=HeadstoreGroup)
@click.option("--debug", is_flag=True, help="Show the Python traceback of an error in the input.")
def main(debug):
    """headstore: featurize texts once with a frozen encoder, train many small heads on the features."""


@main.command()
@click.option("--model", type=PATH, default="minilm", show_default=True,
              help="'minilm' (offline all-MiniLM-L6-v2), a local model dir, or a Hub id.")
@click.option("--data", "data_paths", type=PATH, multiple=True,
              help="Dataset file or folder; repeat for several (at least one --data or --unlabeled).")
@unlabeled_option
@click.option("--format", "formats", multiple=True, type=click.Choice(sorted(FORMATS)),
              help="Dataset format (default: detected); once for all, or once per --data.")
@click.option("--store", type=PATH, required=True, help="Feature store directory (created if absent).")
@click.option("--pooling", type=click.Choice(sorted(POOLING_NAMES)), default="model", show_default=True,
              help="model: the model's own sentence embedding (modules.json: Pooling, Dense, Normalize; mean pooling "
                   "for a plain checkpoint); mean|cls|max: that pooling of the encoder's tokens instead.")
@click.option("--query-prompt", default=None,
              help="Prompt prepended to texts in the query role (BEIR queries; pairs anchors with --pair-roles "
                   "query-document). Default: the model's prompt named query, else its default_prompt_name's, else none.")
@click.option("--document-prompt", default=None,
              help="Prompt prepended to texts in the document role (corpora, STS, symmetric pairs, labelled texts). "
                   "Default: the model's prompt named document/passage/corpus, else its default_prompt_name's, else none.")
@click.option("--prompt-name", default=None,
              help="One of the model's own prompts (config_sentence_transformers.json) for both roles.")
@click.option("--layers", default="-1", show_default=True,
              help="Comma-separated hidden layers, e.g. -1,-4; the first is `features`.")
@click.option("--dtype", type=click.Choice(["float16", "float32"]), default="float16",
              show_default=True)
@click.option("--max-length", type=int, default=None, help="Tokens per text (default: the model's).")
@click.option("--batch-tokens", type=int, default=None,
              help="Tokens per batch, padded (or real where packed) (default 4096 on CPU, 65536 on GPU).")
@click.option("--precision", type=click.Choice(sorted(PRECISIONS)), default="auto", show_default=True,
              help="Encoder maths: auto = fp32 on CPU (exact), bf16 on GPU; part of the fingerprint. On GPU bf16|fp16 "
                   "hold the weights in that dtype (bf16-autocast: fp32 weights under autocast, the old GPU path); "
                   "on CPU bf16 is autocast, emulated and far slower without AMX/AVX-512-BF16 (a warning).")
@click.option("--packing", type=click.Choice(sorted(PACKINGS)), default="auto", show_default=True,
              help="Unpadded batches (each text's real tokens only, varlen attention): auto = on for GPU where the "
                   "architecture allows it, off on CPU. Not part of the fingerprint.")
@click.option("--device", type=click.Choice(DEVICES), default="auto",
              show_default=True)
@click.option("--backend", type=click.Choice(BACKEND_CHOICES), default="auto", show_default=True,
              help="Where the encoder forward runs: torch, or on a CPU its exported graph in ONNX Runtime (onnx) or "
                   "OpenVINO (pip install '.[cpu-fast]'), each checked within 1e-5 of torch for the model (fp32); auto: "
                   "the fastest such one installed (OpenVINO, then ONNX Runtime; torch on a GPU and in bf16), said in "
                   "the summary. In fp32 each segment records it; not part of the fingerprint (in bf16 a runtime is).")
@click.option("--export-cache", type=PATH, default=None,
              help="Folder of the cached onnx|openvino exports and their parity checks (default: "
                   "~/.cache/headstore/exports).")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: this process encodes; ray: a pool of Ray actors (pip install '.[ray]').")
@click.option("--address", default=None,
              help="--engine ray: the Ray cluster to join ('auto': the running one; default: start a local Ray).")
@click.option("--workers", type=int, default=2, show_default=True,
              help="--engine ray: encoder actors (one per GPU with --gpus-per-worker 1).")
@click.option("--gpus-per-worker", type=float, default=0.0, show_default=True,
              help="--engine ray: GPUs per actor (0: CPU actors).")
@label_options
def featurize(model, data_paths, unlabeled, formats, store, pooling, query_prompt, document_prompt, prompt_name,
              layers, dtype, max_length, batch_tokens, precision, packing, device, backend, export_cache, engine,
              address, workers, gpus_per_worker, **label_settings):
    """Encode every text of the datasets (and --unlabeled texts) that STORE does not hold yet (a no-op when none
    are new)."""
    from headstore.featurize.config import FeaturizeConfig, parse_layers
    from headstore.featurize.model import pick_device
    from headstore.featurize.run import featurize as run_featurize

    if batch_tokens is None:
        on_gpu = gpus_per_worker > 0 if engine == "ray" else pick_device(device) == "cuda"
        batch_tokens = 65536 if on_gpu else FeaturizeConfig.batch_tokens
    with named_as_typed():  # --max-length 1: the option named as typed
        config = FeaturizeConfig(model=model, pooling=pooling, query_prompt=query_prompt, document_prompt=document_prompt,
                                 prompt_name=prompt_name, layers=parse_layers(layers),
                                 max_length=max_length, dtype=dtype, batch_tokens=batch_tokens, precision=precision,
                                 packing=packing, device=device, backend=backend, export_cache=export_cache)
    if any(label_settings.values()):  # labelled texts: the options apply to every --data
        formats = [fold_label_options(f, dict(label_settings)) for f in (list(formats) or [None])]
    if engine == "ray":
        from headstore.featurize.ray_engine import featurize_ray

        summary = featurize_ray(config, data_paths, store, formats=list(formats) or None,
                                address=address, workers=workers,
                                gpus_per_worker=gpus_per_worker, unlabeled=unlabeled)
    else:
        summary = run_featurize(config, data_paths, store, formats=list(formats) or None, unlabeled=unlabeled)
    click.echo(json.dumps(summary, indent=2))


@main.group()
def store():
    """Inspect and maintain a feature store."""


@store.command()
@click.argument("path", type=PATH)
def verify(path):
    """Check PATH's integrity; exit 1 listing every problem found."""
    from headstore.featurize.verify import verify_store

    problems = verify_store(path)
    if problems:
        click.echo(f"{path}: {len(problems)} problem(s)", err=True)
        for problem in problems:
            click.echo(f"  - {problem}", err=True)
        sys.exit(1)
    click.echo(f"{path}: OK")


@store.command()
@click.argument("path", type=PATH)
def info(path):
    """Summarise PATH: model, dims, dtype, number of texts, arrays, truncation, size on disk."""
    from headstore.featurize.verify import store_info

    summary = store_info(path)
    click.echo(json.dumps(summary, indent=2))


@store.command()
@click.argument("path", type=PATH)
@click.option("--model", type=PATH, default=None, help="The model the store was made with, when its config.json does not "
              "name it (for recording the model's Normalize).")
def migrate(path, model):
    """Bring PATH up to date in place: store format 1 (one texts.parquet) to format 2 (segments, checksums); a
    mean-pooled store of a model whose own modules are mean pooling then Normalize (MiniLM) gets that
    Normalize recorded (applied on read), so `--pooling model` (the default) can add texts to it."""
    from headstore.featurize.maintain import migrate_store

    summary = migrate_store(path, model)
    click.echo(json.dumps(summary, indent=2))


@store.command()
@click.argument("path", type=PATH)
@click.option("--target-rows", type=int, default=1 << 20, show_default=True,
              help="Rows per merged texts part at most.")
def compact(path, target_rows):
    """Merge PATH's small texts parts (optional: reads are correct without it)."""
    from headstore.featurize.maintain import compact_store

    summary = compact_store(path, target_rows)
    click.echo(json.dumps(summary, indent=2))


@main.command("train-head")
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
@head_and_train_options
@label_options
def train_head(store, data, data_format, unlabeled, out, array, select_ood, ood_delta, score_range, overwrite,
               device, **settings):
    """Train one siamese energy head on stored features: train on train, select on dev, report test once."""
    from headstore.heads.training.run import train_head as run_train_head

    head_cfg, cfg, unset, label_settings = configs_from_options(settings)  # unset: left to the data's kind
    data_format = fold_label_options(data_format, label_settings)
    metrics = run_train_head(store, data, out, head_cfg, cfg, data_format, array, score_range=score_range,
                             overwrite=overwrite, select_ood=tuple(select_ood), ood_delta=ood_delta,
                             kind_defaults=unset, device=device, unlabeled=tuple(unlabeled))
    _echo_metrics(metrics, out)


def _echo_metrics(metrics: dict, out: str) -> None:
    """A short table on the terminal (baseline vs head per split); the full JSON is in OUT's files."""
    from headstore.heads.artefacts.summary import metrics_table

    click.echo(metrics_table(metrics))
    click.echo(f"full metrics: {out}/metrics.json")
    warning = metrics.get("guard", {}).get("warning")
    if warning:
        bar = "!" * 78
        click.secho(f"{bar}\nWARNING: {warning}\n{bar}", fg="red", bold=True, err=True)


@main.command("eval")
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
@label_options
def eval_(store, head_dir, data, data_format, unlabeled, out, exclude_overlap, score_range, overwrite, device,
          **label_settings):
    """Evaluate a trained head (and the frozen baseline beside it) on any dataset whose texts are in the store.

    Scores the dataset's test split; a table without a split column is scored whole."""
    from headstore.heads.training.run import eval_head

    data_format = fold_label_options(data_format, label_settings)
    metrics = eval_head(store, head_dir, data, out, data_format, exclude_overlap, score_range=score_range,
                        overwrite=overwrite, device=device, unlabeled=tuple(unlabeled))
    _echo_metrics(metrics, out)


@main.command()
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
def grid(store, data, data_format, unlabeled, grid_path, out, transfer, select_ood, ood_delta, dry_run, ensembles,
         soups, device, test_scope, score_range, overwrite, engine, address, cpus_per_stack, gpus_per_stack,
         **label_settings):
    """Train every combination of a grid of heads (stacked by shape); write results, leaderboard and plots.

    On labelled texts (--format labels) the grid may sweep shots, hierarchy and per_class; each few-shot
    head is scored beside the frozen probe and k-NN on the same labelled texts (docs/labels.md)."""
    from headstore.heads.experiments.grid import run_grid
    from headstore.heads.experiments.grid_ray import RayOptions

    data_format = fold_label_options(data_format, label_settings)
    if engine == "local" and (address or cpus_per_stack != 1 or gpus_per_stack is not None):
        raise click.BadParameter("--address, --cpus-per-stack and --gpus-per-stack are for --engine ray",
                                 param_hint="--engine")
    ray_options = RayOptions(address, cpus_per_stack, gpus_per_stack)
    run_grid(store, data, grid_path, out, data_format, transfer=tuple(transfer), score_range=score_range,
             overwrite=overwrite, select_ood=tuple(select_ood), ood_delta=ood_delta, ensembles=tuple(ensembles),
             dry_run=dry_run, soups=tuple(soups), test_scope=test_scope, device=device, unlabeled=tuple(unlabeled),
             engine=engine, ray_options=ray_options)


@main.command()
@click.option("--head", "head_dir", type=PATH, required=True, help="A `cli train-head --out` directory to start from.")
@click.option("--out", type=PATH, required=True, help="Output: encoder/ (HF checkpoint for --model), head/, finetune.json.")
@click.option("--store", type=PATH, default=None, help="The head's feature store (default: the one in its config.json).")
@click.option("--data", type=PATH, default=None, help="Training dataset (default: the head's).")
@click.option("--model", "encoder", type=PATH, default=None,
              help="Encoder the store was featurized with (default: the store's model id, e.g. minilm).")
@click.option("--setup", type=click.Choice(sorted(TUNINGS)), default="full", show_default=True,
              help="What trains in the encoder: full (every weight), adapters (bottleneck adapters, the base "
                   "frozen), lora (LoRA on the query/value projections, saved merged).")
@click.option("--adapter-size", type=int, default=64, show_default=True, help="--setup adapters: bottleneck width.")
@click.option("--lora-rank", type=int, default=8, show_default=True, help="--setup lora: the rank r.")
@click.option("--lora-alpha", type=int, default=16, show_default=True, help="--setup lora: updates scaled by alpha/r.")
@click.option("--unfreeze", type=click.Choice(["all", "top-k", "gradual"]), default="all", show_default=True)
@click.option("--top-k", type=int, default=2, show_default=True, help="Layers trained with --unfreeze top-k.")
@click.option("--unfreeze-interval", type=int, default=10, show_default=True,
              help="--unfreeze gradual: steps between unfreezing one more block, top-down.")
@click.option("--encoder-lr", type=float, default=None,
              help="Encoder-side peak lr. Default: the setup's (full 2e-5, adapters 1e-3, lora 5e-4).")
@click.option("--head-lr", type=float, default=None, help="Default: the head's training lr.")
@click.option("--layer-lr-decay", type=float, default=1.0, show_default=True,
              help="Discriminative lrs: encoder-lr x decay^(depth from top).")
@click.option("--batch-size", type=int, default=None, help="Default: the head's batch size.")
@click.option("--max-epochs", type=int, default=None,
              help="Cap on the epochs (default: the head's); dev stops the run sooner (--patience).")
@click.option("--patience", type=int, default=2, show_default=True,
              help="Epochs without a dev improvement before stopping.")
@click.option("--dev-docs", type=int, default=1000, show_default=True,
              help="IR dev: corpus documents scored each epoch beside every document judged for a dev query.")
@click.option("--mined-k", type=int, default=None, help="Mined hard negatives per pair (default: the head's).")
@click.option("--max-steps", type=int, default=None, help="Cap on the steps of the whole run (smoke runs).")
@click.option("--keep", type=click.Choice(["best", "last"]), default="best", show_default=True,
              help="The state written: the best dev epoch's (the start included) or the last.")
@click.option("--gradient-checkpointing/--no-gradient-checkpointing", default=False, show_default=True)
@click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def finetune(head_dir, out, store, data, encoder, **settings):
    """Unfreeze the encoder under a trained head and train both end to end until dev stops improving."""
    from headstore.heads.apply.finetune import FinetuneConfig, finetune as run_finetune

    with named_as_typed():  # --top-k 0: the option named as typed
        cfg = FinetuneConfig(**settings)
    summary = run_finetune(head_dir, out, cfg, store, data, encoder)
    click.echo(json.dumps({k: v for k, v in summary.items() if k != "history"}, indent=2, default=float))


@main.command()
@click.option("--config", "config_path", type=PATH, default=None, help="TOML file (see examples/compare.toml).")
@click.option("--out", type=PATH, required=True, help="Output directory (rerunning reuses finished steps).")
@click.option("--in-domain", type=PATH, default=None, help="Dataset the heads train on (its test split is reported).")
@click.option("--ood", "out_of_domain", type=PATH, multiple=True, help="Out-of-domain dataset; repeat for several.")
@click.option("--model", type=PATH, default=None, help="Base encoder (default minilm).")
@click.option("--base-store", type=PATH, default=None, help="Reuse this store for the base encoder's features.")
@click.option("--adapt-steps", type=int, default=None, help="MLM adaptation steps.")
@click.option("--finetune-steps", type=int, default=None, help="Cap on finetune steps (default: one epoch).")
@click.option("--mlm/--no-mlm", default=None, help="Measure MLM loss on held-out text (forgetting).")
@click.option("--seeds", default=None, help="Comma-separated seeds, e.g. 0,1,2 (head init, batch order, tuning runs).")
@click.option("--setups", default=None, help="Comma-separated rows (default: all): "
              "frozen-cosine, frozen-head, adapted-*, adapters-*, lora-*, finetuned-* (*: cosine or head).")
@click.option("--device", type=click.Choice(DEVICES), default=None,
              help="cpu | cuda: every part there (stores, heads, MLM, tuning, evaluation), the device in every "
                   "step's key. Default: [compare] device, else auto (each part's own: cuda when available).")
def compare(config_path, out, seeds, setups, **overrides):
    """Every setup (frozen, MLM-adapted, adapters, LoRA, fine-tuned; with and without a head) over seeds, in and
    out of domain, with 95% CIs and paired differences: compare.md, compare.json, compare.png."""
    from headstore.heads.experiments.compare import load_compare_config, run_compare, split_list

    config = load_compare_config(config_path, seeds=split_list(seeds, int, "--seeds"),
                                 setups=split_list(setups, str, "--setups"), **overrides)
    table = run_compare(config, out)
    click.echo(table)


from headstore.featurize.tuning.adapt_cli import adapt_command  # noqa: E402

main.add_command(adapt_command)

from headstore.heads.apply.export_cli import export_command, index_command, search_command  # noqa: E402

for _command in (export_command, index_command, search_command):
    main.add_command(_command)
from headstore.heads.experiments.labels_cli import forgetting_command, setfit_command  # noqa: E402

main.add_command(forgetting_command)
main.add_command(setfit_command)
from headstore.heads.experiments.distill_cli import distill_command  # noqa: E402

main.add_command(distill_command)

if __name__ == "__main__":
    main()
