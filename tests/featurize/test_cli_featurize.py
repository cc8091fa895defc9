"""CLI round trip with click's CliRunner: featurize, rerun (no-op), info, verify."""

from __future__ import annotations

import json

import polars as pl
from click.testing import CliRunner

from headstore.cli import main
from headstore.featurize.store.reader import FeatureStore


def test_cli_round_trip(tiny_model, texts, tmp_path):
    (tmp_path / "a.txt").write_text("\n".join(texts[:30]) + "\n")
    pl.DataFrame({"text": texts[20:]}).write_parquet(tmp_path / "b.parquet")
    store = tmp_path / "s"
    args = ["featurize", "--model", tiny_model, "--data", str(tmp_path / "a.txt"),
            "--data", str(tmp_path / "b.parquet"), "--format", "text", "--store", str(store),
            "--layers", "-1,-2", "--batch-tokens", "256", "--device", "cpu"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["n_encoded"] == len(texts) == summary["n_texts"]
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and json.loads(again.stdout)["n_encoded"] == 0
    assert FeatureStore.open(store).arrays == ["features", "features_layer-2"]

    info = CliRunner().invoke(main, ["store", "info", str(store)])
    assert info.exit_code == 0 and json.loads(info.output)["n_texts"] == len(texts)
    ok = CliRunner().invoke(main, ["store", "verify", str(store)])
    assert ok.exit_code == 0 and "OK" in ok.output

    part = next((store / "texts").glob("part-*.parquet"))
    part.write_bytes(b"not parquet")
    bad = CliRunner().invoke(main, ["store", "verify", str(store)])
    assert bad.exit_code == 1 and part.name in bad.output


def test_cli_rejects_bad_options(tiny_model, tmp_path):
    (tmp_path / "a.txt").write_text("one cat\n")
    base = ["featurize", "--model", tiny_model, "--data", str(tmp_path / "a.txt"),
            "--store", str(tmp_path / "s")]
    result = CliRunner().invoke(main, base + ["--pooling", "median"])
    assert result.exit_code == 2 and "'cls', 'max', 'mean'" in result.output
    result = CliRunner().invoke(main, base + ["--layers", "last"])
    assert result.exit_code == 2 and "comma-separated ints" in result.output  # bad input: exit 2 (cli.py)
    result = CliRunner().invoke(main, ["featurize", "--model", str(tmp_path / "nope.bin"), "--data",
                                       str(tmp_path / "a.txt"), "--store", str(tmp_path / "s")])
    assert result.exit_code != 0
