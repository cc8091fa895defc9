"""`cli finetune`: a thin click layer over heads.apply.finetune (registered on the main group in cli.py)."""
from __future__ import annotations

import json

import click

from headstore.data.options import PATH, named_as_typed
from headstore.featurize.encoder.config import DEVICES
from headstore.heads.apply.tunings import TUNINGS


@click.command("finetune")
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
def finetune_command(head_dir, out, store, data, encoder, **settings):
    """Unfreeze the encoder under a trained head and train both end to end until dev stops improving."""
    from headstore.heads.apply.finetune import FinetuneConfig, finetune as run_finetune

    with named_as_typed():  # --top-k 0: the option named as typed
        cfg = FinetuneConfig(**settings)
    summary = run_finetune(head_dir, out, cfg, store, data, encoder)
    click.echo(json.dumps({k: v for k, v in summary.items() if k != "history"}, indent=2, default=float))
