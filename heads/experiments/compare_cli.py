"""`cli compare`: a thin click layer over heads.experiments.compare (registered on the main group in cli.py)."""
from __future__ import annotations

import click

from headstore.data.options import PATH
from headstore.featurize.encoder.config import DEVICES


@click.command("compare")
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
def compare_command(config_path, out, seeds, setups, **overrides):
    """Every setup (frozen, MLM-adapted, adapters, LoRA, fine-tuned; with and without a head) over seeds, in and
    out of domain, with 95% CIs and paired differences: compare.md, compare.json, compare.png."""
    from headstore.heads.experiments.compare import load_compare_config, run_compare, split_list

    config = load_compare_config(config_path, seeds=split_list(seeds, int, "--seeds"),
                                 setups=split_list(setups, str, "--setups"), **overrides)
    table = run_compare(config, out)
    click.echo(table)
