"""`cli compare` and `cli forgetting`: thin click layers over heads.experiments.compare.run and
heads.experiments.compare.forgetting (registered on the main group in cli.py)."""
from __future__ import annotations

from pathlib import Path

import click

from headstore.data.options import PATH, fold_label_options, label_read_options
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
    from headstore.heads.experiments.compare.run import load_compare_config, run_compare, split_list

    config = load_compare_config(config_path, seeds=split_list(seeds, int, "--seeds"),
                                 setups=split_list(setups, str, "--setups"), **overrides)
    table = run_compare(config, out)
    click.echo(table)


@click.command("forgetting")
@click.option("--store", type=PATH, required=True, help="Base-encoder feature store holding both tasks' texts.")
@click.option("--out", type=PATH, required=True, help="Output directory (rerunning reuses finished steps).")
@click.option("--task-a", type=PATH, default=None, help="Dataset trained first (its test metric is the forgetting measure).")
@click.option("--task-b", type=PATH, default=None, help="Dataset trained second.")
@click.option("--data", type=PATH, default=None, help="Instead of --task-a/--task-b: a labelled dataset split into two "
                                            "disjoint halves of its classes (sorted names: first half A, second B).")
@click.option("--train-per-class", type=int, default=64, show_default=True, help="--data: train texts per class kept.")
@click.option("--test-per-class", type=int, default=100, show_default=True, help="--data: test texts per class kept.")
@label_read_options
@click.option("--model", type=PATH, default="minilm", show_default=True, help="The encoder the store was featurized with.")
@click.option("--loss", default="l1-energy", show_default=True, help="Both heads' loss (l1-energy fits labels, STS, IR).")
@click.option("--epochs", type=int, default=10, show_default=True)
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option("--encoder-lr", type=float, default=2e-5, show_default=True, help="Setup 3's fine-tuning rate.")
@click.option("--finetune-steps", type=int, default=None, help="Cap on each fine-tune's steps (default: one epoch).")
@click.option("--finetune-batch-size", type=int, default=None, help="Fine-tune batch (default: the head's).")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16"]), default="auto", show_default=True,
              help="Re-featurizing with setup 3's fine-tuned encoders (its before and after alike).")
@click.option("--mlm/--no-mlm", default=True, show_default=True, help="MLM loss of the encoder before/after.")
def forgetting_command(store, out, task_a, task_b, data, train_per_class, test_per_class, data_format, model, loss,
                       epochs, batch_size, encoder_lr, finetune_steps, finetune_batch_size, precision, mlm,
                       **label_settings):
    """Train task A then task B; measure what A loses for per-task heads, a shared head and a fine-tuned encoder."""
    from headstore.featurize.encoder.config import FeaturizeConfig
    from headstore.heads.apply.finetune import FinetuneConfig
    from headstore.heads.settings.config import TrainConfig
    from headstore.heads.experiments.compare.forgetting import (FORGETTING_TRAIN, ForgettingConfig, run_forgetting,
                                                         split_classes)

    fmt = fold_label_options(data_format, label_settings)
    fmt_a = fmt_b = fmt
    if data is not None:
        if task_a or task_b:
            raise ValueError("give --data (split into halves) or --task-a and --task-b, not both")
        task_a, task_b = split_classes(data, fmt, Path(out) / "data", train_per_class, test_per_class)
        fmt_a = fmt_b = "labels"
    elif not (task_a and task_b):
        raise ValueError("give --task-a and --task-b, or --data to split a labelled dataset into halves")
    cfg = ForgettingConfig(task_a=task_a, task_b=task_b, store=store, format_a=fmt_a, format_b=fmt_b, model=model,
                           train=TrainConfig(loss=loss, epochs=epochs, batch_size=batch_size, **FORGETTING_TRAIN),
                           finetune=FinetuneConfig(encoder_lr=encoder_lr, max_steps=finetune_steps,
                                                   batch_size=finetune_batch_size, mined_k=0),
                           featurize=FeaturizeConfig(precision=precision), mlm=mlm)
    click.echo(run_forgetting(cfg, out))
