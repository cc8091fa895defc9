"""`cli adapt`: continued MLM pre-training of the encoder (registered by cli.py)."""
from __future__ import annotations

import json
import logging

import click

from headstore.data.options import PATH, NonEmptyPath, named_as_typed
from headstore.featurize.encoder.config import AdaptConfig

_DEFAULTS = AdaptConfig()


@click.command("adapt")
@click.option("--data", "data", multiple=True, required=True, type=NonEmptyPath(exists=True, readable=True),
              help="Unlabeled text: a BEIR folder (its corpus), a .txt (one passage per line) or a Parquet "
                   "text column; repeat for several.")
@click.option("--model", type=PATH, default=_DEFAULTS.model, show_default=True,
              help="'minilm', a model directory, or a Hub id.")
@click.option("--out", "out_dir", required=True, type=NonEmptyPath(file_okay=False, readable=True),
              help="Output folder: the adapted encoder (usable as --model) and checkpoint-last/.")
@click.option("--column", default="text", show_default=True, help="Text column of Parquet input.")
@click.option("--max-length", default=_DEFAULTS.max_length, show_default=True, type=int)
@click.option("--mlm-probability", default=_DEFAULTS.mlm_probability, show_default=True, type=float)
@click.option("--whole-word/--no-whole-word", default=_DEFAULTS.whole_word, show_default=True)
@click.option("--head-only", is_flag=True,
              help="Train only the MLM head on the frozen encoder (baseline for headless models).")
@click.option("--lr", default=_DEFAULTS.lr, show_default=True, type=float)
@click.option("--fresh-head-lr", default=_DEFAULTS.fresh_head_lr, show_default=True, type=float,
              help="Learning rate of a newly initialised MLM head's own parameters.")
@click.option("--warmup-ratio", default=_DEFAULTS.warmup_ratio, show_default=True, type=float)
@click.option("--weight-decay", default=_DEFAULTS.weight_decay, show_default=True, type=float)
@click.option("--batch-size", default=_DEFAULTS.batch_size, show_default=True, type=int)
@click.option("--epochs", default=_DEFAULTS.epochs, show_default=True, type=float)
@click.option("--max-steps", default=None, type=int, help="Step budget (overrides --epochs).")
@click.option("--holdout-fraction", default=_DEFAULTS.holdout_fraction, show_default=True,
              type=float, help="Texts kept out of training (chosen by text_id hash).")
@click.option("--seed", default=_DEFAULTS.seed, show_default=True, type=int)
@click.option("--device", default=_DEFAULTS.device, show_default=True)
@click.option("--bf16/--no-bf16", default=_DEFAULTS.bf16, show_default=True,
              help="bf16 autocast on CUDA and on a CPU with native bf16 (AVX-512-BF16, AMX).")
@click.option("--save-every", default=_DEFAULTS.save_every, show_default=True, type=int)
@click.option("--stop-after-steps", default=None, type=int,
              help="Checkpoint and stop after this many steps in this call (rerun to resume).")
def adapt_command(data, model, out_dir, column, max_length, mlm_probability, whole_word,
                  head_only, lr, fresh_head_lr, warmup_ratio, weight_decay, batch_size, epochs, max_steps,
                  holdout_fraction, seed, device, bf16, save_every, stop_after_steps):
    """Continue masked-language-model pre-training of --model on the unlabeled --data (IR corpus
    folders, .txt files, Parquet text columns). Reruns with the same options resume."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # bad input (ValueError) is shown by cli.py's group: one line, exit 2
    with named_as_typed():  # --max-steps 0: the option named as typed
        config = AdaptConfig(
            model=model, max_length=max_length, mlm_probability=mlm_probability,
            whole_word=whole_word, train_encoder=not head_only, lr=lr,
            fresh_head_lr=fresh_head_lr, warmup_ratio=warmup_ratio,
            weight_decay=weight_decay, batch_size=batch_size, epochs=epochs, max_steps=max_steps,
            holdout_fraction=holdout_fraction, seed=seed, device=device, bf16=bf16,
            save_every=save_every)
    from headstore.featurize.tuning.adapt import adapt  # here: `import headstore.cli` stays free of torch

    summary = adapt(config, list(data), out_dir, column=column,
                    stop_after_steps=stop_after_steps)
    if summary["mlm_head_newly_initialised"]:
        click.secho(f"NOTE: {model} had no MLM head; a fresh head (decoder tied to the input "
                    "embeddings) was trained with it. Recorded in adapt.json.", fg="yellow", err=True)
    shown = {k: v for k, v in summary.items() if k not in ("losses", "config")}
    click.echo(json.dumps(shown, indent=1))
    if not summary["finished"]:
        click.echo(f"stopped at step {summary['steps']} of {summary['total_steps']}; "
                   "rerun the same command to resume", err=True)
