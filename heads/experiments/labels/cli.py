"""`cli setfit-compare`: a thin click layer over heads.experiments.labels.setfit (registered on the main group in
cli.py)."""
from __future__ import annotations


import click

from headstore.data.options import PATH, fold_label_options, label_read_options


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
    from headstore.heads.experiments.labels.setfit import SetFitCompareConfig, run_setfit_compare

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
