"""headstore command line: one click group, each command a thin layer over one library call.

Bad input (a ValueError such as DataError or StoreError, a missing file, a refused path) is shown as one
line, `Error: path:line/row: problem (what to do)`, with exit code 2 and no traceback; `cli --debug ...`
shows the traceback. Anything else is a bug and keeps its traceback. docs/bad-input.md lists the cases.
"""

from __future__ import annotations

import errno
import json
import os
import sys

# The command line's process is its own: these settings are made here, for good, before anything imports
# torch or polars (their runtimes read them at load, so they cannot be scoped; the library never sets them).
# A value the user set is kept. Measured on a 2-core machine:
# - OMP_WAIT_POLICY=PASSIVE: OpenMP threads that reach a barrier sleep instead of spinning. On a CPU shared
#   with other busy processes, spinning waiters keep the one thread that still has work off its core; at
#   load ~4, MiniLM forwards were 1.7-25x faster (the smaller the batch, the larger the gain); same numbers.
#   Not for the commands that train heads (SPINNING_COMMANDS): their steps are many small parallel regions, each
#   paying a sleeping thread's wake-up; the STS-B grid (bf16, 2-core Zen 4, quiet) took 51.5 / 58.1 s with it
#   against 42.5 / 46.3 / 45.0 s without (docs/results/heads.md), the same numbers.
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
SPINNING_COMMANDS = ("grid", "train-head")  # OMP_WAIT_POLICY left at OpenMP's default (spinning) for these


def _command(argv: list[str]) -> str | None:
    """The subcommand named on the command line (the first word that is not an option), None without one."""
    return next((a for a in argv[1:] if not a.startswith("-")), None)


for _key, _value in CLI_ENVIRONMENT.items():
    if not (_key == "OMP_WAIT_POLICY" and _command(sys.argv) in SPINNING_COMMANDS):
        os.environ.setdefault(_key, _value)
# `cli grid` also has glibc's malloc keep what it frees (headstore.data.process.keep_freed_memory): a step's casts
# and gradients, a few MB each, were fresh zeroed pages every step. The STS-B grid (bf16, 2-core Zen 4, quiet): 46-51 s
# against 50-56 s, the same numbers; its cost, the peak RSS of a 1M-document train-head: 2.71 against 2.60 GB, so
# train-head is left as it was (docs/results/heads.md).
KEEP_FREED_COMMANDS = ("grid",)
if _command(sys.argv) in KEEP_FREED_COMMANDS:
    from headstore.data.process import keep_freed_memory

    keep_freed_memory()

import click  # noqa: E402  (every import below may load torch or polars)

from headstore.data.dataset import FORMATS
from headstore.data.errors import SystemFailure
from headstore.featurize.encoder.backends import CHOICES as BACKEND_CHOICES
from headstore.featurize.encoder.config import DEVICES, PACKINGS, POOLING_NAMES, PRECISIONS
from headstore.data.options import PATH, fold_label_options, label_options, named_as_typed, unlabeled_option


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
@click.option("--taps", is_flag=True, help="Also store every layer's taps, mean-pooled: attention output, MLP "
              "intermediate, block output (arrays tap_<attn|mlp|block>_<layer>; docs/taps.md). Part of the fingerprint.")
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
              layers, taps, dtype, max_length, batch_tokens, precision, packing, device, backend, export_cache, engine,
              address, workers, gpus_per_worker, **label_settings):
    """Encode every text of the datasets (and --unlabeled texts) that STORE does not hold yet (a no-op when none
    are new)."""
    from headstore.featurize.encoder.config import FeaturizeConfig, parse_layers
    from headstore.featurize.run.local import featurize as run_featurize

    # --batch-tokens unset (None): the device's default, resolved with the other settings (featurize.encoder.resolved)
    with named_as_typed():  # --max-length 1: the option named as typed
        config = FeaturizeConfig(model=model, pooling=pooling, query_prompt=query_prompt, document_prompt=document_prompt,
                                 prompt_name=prompt_name, layers=parse_layers(layers), taps=taps,
                                 max_length=max_length, dtype=dtype, batch_tokens=batch_tokens, precision=precision,
                                 packing=packing, device=device, backend=backend, export_cache=export_cache)
    if any(label_settings.values()):  # labelled texts: the options apply to every --data
        formats = [fold_label_options(f, dict(label_settings)) for f in (list(formats) or [None])]
    if engine == "ray":
        from headstore.featurize.run.ray_engine import featurize_ray

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
    from headstore.featurize.store.verify import verify_store

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
    from headstore.featurize.store.verify import store_info

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
    from headstore.featurize.store.maintain import migrate_store

    summary = migrate_store(path, model)
    click.echo(json.dumps(summary, indent=2))


@store.command()
@click.argument("path", type=PATH)
@click.option("--target-rows", type=int, default=1 << 20, show_default=True,
              help="Rows per merged texts part at most.")
def compact(path, target_rows):
    """Merge PATH's small texts parts (optional: reads are correct without it)."""
    from headstore.featurize.store.maintain import compact_store

    summary = compact_store(path, target_rows)
    click.echo(json.dumps(summary, indent=2))


from headstore.featurize.tuning.adapt_cli import adapt_command  # noqa: E402
from headstore.heads.apply.export_cli import export_command, index_command, search_command  # noqa: E402
from headstore.heads.apply.finetune_cli import finetune_command  # noqa: E402
from headstore.heads.experiments.compare.cli import compare_command, forgetting_command  # noqa: E402
from headstore.heads.experiments.heads_cli import (eval_command, grid_command, select_taps_command,  # noqa: E402
                                                  train_head_command)
from headstore.heads.experiments.labels.cli import setfit_command  # noqa: E402

# the other commands live beside the library they drive, a thin click layer each (`<area>_cli.py`)
for _command in (train_head_command, eval_command, grid_command, finetune_command, compare_command, adapt_command,
                 export_command, index_command, search_command, forgetting_command, setfit_command,
                 select_taps_command):
    main.add_command(_command)

from headstore.heads.experiments.distill.cli import distill_command  # noqa: E402

main.add_command(distill_command)


def run() -> None:
    """The `cli` program (pyproject's entry point; `python -m headstore.cli`): `main` in a process of its own, whose
    objects are frozen out of the garbage collector at exit (gc.freeze, an atexit handler: the last collection at
    interpreter shutdown walks every object, ~0.8 s with torch and a grid's modules loaded on a 2-core Zen 4; every
    file is written and closed by then). Not in `main`: a process that imports this module keeps its exit as it was."""
    import atexit
    import gc

    atexit.register(gc.freeze)
    main()


if __name__ == "__main__":
    run()
