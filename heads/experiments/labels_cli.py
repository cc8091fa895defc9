"""`cli forgetting` and `cli setfit-compare`: thin click layers over heads.experiments.forgetting and
heads.experiments.setfit_compare (registered on the main group in cli.py)."""
from __future__ import annotations

from pathlib import Path

import click

from headstore.data.options import PATH, fold_label_options, label_read_options


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
    from headstore.heads.experiments.forgetting import (FORGETTING_TRAIN, ForgettingConfig, run_forgetting,
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


@click.command("setfit-compare")
@click.option("--store", type=PATH, required=True, help="Feature store holding the dataset's texts (MiniLM).")
@click.option("--data", type=PATH, required=True, help="Labelled dataset (e.g. ../shared/datasets/20newsgroups).")
@click.option("--out", type=PATH, required=True, help="Output directory (rerunning reuses finished runs).")
@label_read_options
@click.option("--shots", default="8", show_default=True, help="Comma-separated texts per class.")
@click.option("--seeds", default="0,1,2", show_default=True, help="Comma-separated seeds (each draws its own texts).")
@click.option("--losses", default="ce,supcon-kl", show_default=True,
              help="headstore heads, comma-separated: a classifier head (ce) is scored by its argmax, an energy head "
                   "by the tuned probe on its outputs and by k-NN.")
@click.option("--test-per-class", type=int, default=None,
              help="Score a fixed stratified sample of the test split (the same for every method); default: all of it.")
@click.option("--setfit-body/--no-setfit-body", default=True, show_default=True,
              help="Run SetFit's contrastive body fine-tuning (b); slow on a CPU.")
@click.option("--setfit-max-steps", type=int, default=None,
              help="Cap on SetFit's body steps (default: its one epoch; a cap is reported as a deviation).")
@click.option("--model", type=PATH, default="minilm", show_default=True, help="The encoder: SetFit loads its local directory.")
def setfit_command(store, data, out, data_format, shots, seeds, losses, test_per_class, setfit_body, setfit_max_steps,
                   model, **label_settings):
    """SetFit (frozen body + logistic regression; contrastive body fine-tuning) beside headstore's heads and probe."""
    from headstore.heads.experiments.setfit_compare import SetFitCompareConfig, run_setfit_compare

    try:
        import setfit  # noqa: F401
    except ImportError:
        raise ValueError("cli setfit-compare needs SetFit: pip install -e '.[setfit]'") from None
    cfg = SetFitCompareConfig(
        data=data, store=store, data_format=fold_label_options(data_format, label_settings),
        shots=tuple(int(s) for s in shots.split(",")), seeds=tuple(int(s) for s in seeds.split(",")),
        losses=tuple(x.strip() for x in losses.split(",") if x.strip()), test_per_class=test_per_class,
        setfit_body=setfit_body, setfit_max_steps=setfit_max_steps, model=model)
    click.echo(run_setfit_compare(cfg, out))
