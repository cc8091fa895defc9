"""headstore command line: one click group, each command a thin layer over one library call."""

from __future__ import annotations

import json
import sys

import click

from featurize.pooling import POOLINGS


@click.group()
def main():
    """headstore: featurize texts once with a frozen encoder, train many small heads on the features."""


@main.command()
@click.option("--model", default="minilm", show_default=True,
              help="'minilm' (offline all-MiniLM-L6-v2), a local model dir, or a Hub id.")
@click.option("--data", "data_paths", multiple=True, required=True,
              help="Dataset file or folder; repeat for several.")
@click.option("--format", "formats", multiple=True,
              help="Dataset format (default: detected); once for all, or once per --data.")
@click.option("--store", required=True, help="Feature store directory (created if absent).")
@click.option("--pooling", type=click.Choice(sorted(POOLINGS)), default="mean", show_default=True)
@click.option("--layers", default="-1", show_default=True,
              help="Comma-separated hidden layers, e.g. -1,-4; the first is `features`.")
@click.option("--dtype", type=click.Choice(["float16", "float32"]), default="float16",
              show_default=True)
@click.option("--max-length", type=int, default=None, help="Tokens per text (default: the model's).")
@click.option("--batch-tokens", type=int, default=None,
              help="Padded tokens per batch (default 16384 on CPU, 65536 on GPU).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True)
def featurize(model, data_paths, formats, store, pooling, layers, dtype, max_length, batch_tokens,
              device):
    """Encode every text of the datasets that STORE does not hold yet (a no-op when none are new)."""
    from featurize.config import FeaturizeConfig, parse_layers
    from featurize.model import pick_device
    from featurize.run import featurize as run_featurize

    try:
        if batch_tokens is None:
            batch_tokens = 65536 if pick_device(device) == "cuda" else 16384
        config = FeaturizeConfig(model=model, pooling=pooling, layers=parse_layers(layers),
                                 max_length=max_length, dtype=dtype, batch_tokens=batch_tokens,
                                 device=device)
        summary = run_featurize(config, data_paths, store, formats=list(formats) or None)
    except (ValueError, FileNotFoundError) as err:
        raise click.ClickException(str(err)) from None
    click.echo(json.dumps(summary, indent=2))


@main.group()
def store():
    """Inspect a feature store."""


@store.command()
@click.argument("path")
def verify(path):
    """Check PATH's integrity; exit 1 listing every problem found."""
    from featurize.verify import verify_store

    problems = verify_store(path)
    if problems:
        click.echo(f"{path}: {len(problems)} problem(s)", err=True)
        for problem in problems:
            click.echo(f"  - {problem}", err=True)
        sys.exit(1)
    click.echo(f"{path}: OK")


@store.command()
@click.argument("path")
def info(path):
    """Summarise PATH: model, dims, dtype, number of texts, arrays, truncation, size on disk."""
    from featurize.verify import store_info

    try:
        summary = store_info(path)
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    click.echo(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
