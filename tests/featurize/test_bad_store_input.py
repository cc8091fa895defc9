"""Bad input to featurize and damaged stores, through the CLI: a message naming the file / row, no
traceback, and (featurize) no store left behind. docs/bad-input.md lists the cases."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
import zarr
from click.testing import CliRunner

from headstore.cli import main
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.layout import StoreError
from headstore.heads.network.features import load_features

from store_helpers import config


def invoke(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


@pytest.fixture
def store(tiny_model, texts, tmp_path):
    path = tmp_path / "s"
    featurize_texts(config(tiny_model, commit_seconds=3600), texts[:40], path)  # 40 rows, 3 shards
    return path


def featurize_args(tiny_model, data, store, *extra):
    return ["featurize", "--model", tiny_model, "--data", data, "--store", store, "--device", "cpu",
            *extra]


# ---- cli store verify ---------------------------------------------------------------------------

def test_verify_names_a_deleted_shard_file(store):
    shard = store / "features.zarr" / "c" / "1" / "0"
    shard.unlink()
    result = invoke("store", "verify", store)
    assert result.exit_code == 1 and f"{shard}: shard file missing (rows 16..31" in result.output
    with pytest.raises(StoreError, match=str(shard)):
        FeatureStore.open(store).features()


def test_verify_and_readers_name_a_zeroed_region(store):
    shard = store / "features.zarr" / "c" / "0" / "0"
    data = bytearray(shard.read_bytes())
    data[100:300] = bytes(200)  # inside the first chunks, index intact
    shard.write_bytes(bytes(data))
    result = invoke("store", "verify", store)
    assert result.exit_code == 1 and str(shard) in result.output and "checksum" in result.output
    with pytest.raises(StoreError, match=f"{shard}: cannot be read .*checksum"):
        FeatureStore.open(store).features([0, 1])
    np.testing.assert_array_equal(FeatureStore.open(store).features([20]).shape, (1, 32))  # other shards read


@pytest.mark.parametrize("block", [1 << 16, 7, 1])  # one block; blocks splitting the store's rows; row by row
def test_verify_and_training_loader_name_nan_rows(store, monkeypatch, block):
    from headstore.featurize.store import reader as store_module
    monkeypatch.setattr(store_module, "FINITE_BLOCK", block)
    arr = zarr.open_array(store / "features.zarr", mode="r+")
    arr[7, 3] = np.nan
    arr[21, 0] = np.inf
    result = invoke("store", "verify", store)
    assert result.exit_code == 1 and "2 row(s) with NaN/inf, first at row 7" in result.output
    with pytest.raises(StoreError, match=r"row\(s\) 7, 21 \(2 in all\) hold NaN/inf"):
        load_features(FeatureStore.open(store))


def test_verify_names_a_truncated_texts_part(store):
    part = sorted((store / "texts").glob("part-*.parquet"))[0]
    part.write_bytes(part.read_bytes()[:-50])
    result = invoke("store", "verify", store)
    assert result.exit_code == 1 and f"{part}:" in result.output and "truncated" in result.output
    with pytest.raises(StoreError, match=f"{part}: has .* bytes"):
        FeatureStore.open(store)
    info = invoke("store", "info", store)
    assert info.exit_code == 2 and str(part) in info.output


def overwrite_same_size(part) -> None:
    """Other bytes of the same size in the middle of a texts part (its size check passes)."""
    data = bytearray(part.read_bytes())
    middle = len(data) // 2
    data[middle: middle + 64] = bytes(b ^ 0x5A for b in data[middle: middle + 64])
    part.write_bytes(bytes(data))


def test_readers_check_a_texts_part_sha256_on_first_read(tiny_model, texts, tmp_path, store):
    part = sorted((store / "texts").glob("part-*.parquet"))[0]
    overwrite_same_size(part)
    opened = FeatureStore.open(store)  # sizes only: opening stays cheap
    for read in (lambda: opened.texts, lambda: opened.find_rows(["0" * 32]),
                 lambda: opened.scan_texts(["text"])):
        with pytest.raises(StoreError, match=f"{part}: sha256 differs from the one committed"):
            read()
    (tmp_path / "same.txt").write_text("\n".join(texts[:40]))
    result = invoke(*featurize_args(tiny_model, tmp_path / "same.txt", store, "--dtype", "float32"))
    assert result.exit_code == 2 and f"{part}: sha256 differs" in result.output
    assert "cli store verify" in result.output


@pytest.mark.parametrize("damage", ["truncated-of-many", "overwritten-only-part"])
def test_compact_refuses_a_damaged_part_naming_it(tiny_model, texts, tmp_path, store, damage):
    if damage == "truncated-of-many":
        store = tmp_path / "many"
        featurize_texts(config(tiny_model), texts[:40], store)  # one part per window
        parts = sorted((store / "texts").glob("part-*.parquet"))
        assert len(parts) > 2
        part = parts[1]
        part.write_bytes(part.read_bytes()[:-50])
    else:
        assert invoke("store", "compact", store).exit_code == 0  # one part left
        part, = sorted((store / "texts").glob("part-*.parquet"))
        overwrite_same_size(part)
    before = sorted(p.name for p in (store / "texts").iterdir())
    manifest = (store / "manifest.json").read_bytes()
    result = invoke("store", "compact", store)
    assert result.exit_code == 2 and f"Error: {part}:" in result.output, result.output
    assert "nothing was compacted" in result.output and "cli store verify" in result.output
    assert sorted(p.name for p in (store / "texts").iterdir()) == before
    assert (store / "manifest.json").read_bytes() == manifest


def test_verify_names_a_manifest_that_is_not_json(store):
    (store / "manifest.json").write_text('{"fingerprint": "abc", "arr')
    result = invoke("store", "verify", store)
    assert result.exit_code == 1 and f"{store / 'manifest.json'}: not valid JSON" in result.output
    info = invoke("store", "info", store)
    assert info.exit_code == 2 and "manifest.json: not valid JSON" in info.output


# ---- featurize: refused before any store exists ---------------------------------------------------

@pytest.mark.parametrize("kind", ["zero-bytes", "blank-lines", "header-only-parquet", "empty-list"])
def test_featurize_of_no_texts_is_an_error(tiny_model, tmp_path, kind):
    data = tmp_path / ("in.parquet" if "parquet" in kind else "in.txt")
    if kind == "zero-bytes":
        data.write_bytes(b"")
    elif kind == "blank-lines":
        data.write_text("\n   \n\n")
    else:
        pl.DataFrame(schema={"text": pl.String}).write_parquet(data)
    if kind == "empty-list":
        with pytest.raises(ValueError, match="no texts to featurize"):
            featurize_texts(config(tiny_model), [], tmp_path / "s")
    else:
        result = invoke(*featurize_args(tiny_model, data, tmp_path / "s", "--format", "text"))
        assert result.exit_code == 2 and f"{data}" in result.output and "no texts" in result.output
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("extra, message", [
    (["--max-length", "100"], "--max-length 100 is more than"),
    (["--layers", "-1,7"], "layer 7 out of range for a 2-layer model"),
    (["--model", "MISSING"], "no such model directory"),
])
def test_bad_model_options_are_refused_before_the_store_is_created(tiny_model, texts, tmp_path,
                                                                   extra, message):
    (tmp_path / "a.txt").write_text("\n".join(texts[:5]))
    args = featurize_args(tiny_model, tmp_path / "a.txt", tmp_path / "s")
    if extra[0] == "--model":
        args[2] = str(tmp_path / "models" / "nope")
        (tmp_path / "models").mkdir()
    else:
        args += extra
    result = invoke(*args)
    assert result.exit_code == 2 and message in result.output
    if extra[0] == "--model":
        assert str(tmp_path / "models" / "nope") in result.output
    assert not (tmp_path / "s").exists() and not (tmp_path / "s.incomplete").exists()


# ---- a read-only store ----------------------------------------------------------------------------

def run_on_read_only(store, args) -> subprocess.CompletedProcess:
    """`python -m headstore.cli ARGS` with STORE mounted read-only (root: a private mount
    namespace), or made read-only by permissions (anyone else)."""
    command = [sys.executable, "-m", "headstore.cli", *map(str, args)]
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "a-w", str(store)], check=True)
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=300)
        finally:
            subprocess.run(["chmod", "-R", "u+w", str(store)], check=True)
    if shutil.which("unshare") is None:
        pytest.skip("no unshare to mount the store read-only")
    script = (f'mount --bind "{store}" "{store}" && mount -o remount,bind,ro "{store}" || exit 97; '
              + " ".join(f"'{c}'" for c in command))
    result = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True,
                            text=True, timeout=300)
    if result.returncode == 97:
        pytest.skip("cannot mount read-only here")
    return result


def test_a_read_only_store_reads_and_takes_a_no_op_featurize(tiny_model, texts, tmp_path, store):
    (store / ".lock").unlink(missing_ok=True)
    (tmp_path / "same.txt").write_text("\n".join(texts[:40]))
    (tmp_path / "more.txt").write_text("\n".join(texts))
    before = sorted((p.relative_to(store), p.stat().st_mtime_ns) for p in store.rglob("*"))
    for args in (["store", "info", store], ["store", "verify", store]):
        result = run_on_read_only(store, args)
        assert result.returncode == 0, result.stderr[-2000:]
    noop = run_on_read_only(store, featurize_args(tiny_model, tmp_path / "same.txt", store,
                                                  "--dtype", "float32"))
    assert noop.returncode == 0, noop.stderr[-2000:]
    assert json.loads(noop.stdout)["n_encoded"] == 0
    more = run_on_read_only(store, featurize_args(tiny_model, tmp_path / "more.txt", store,
                                                  "--dtype", "float32"))
    assert more.returncode == 2 and "Traceback" not in more.stderr
    assert f"{store}: cannot write to the store" in more.stderr
    assert sorted((p.relative_to(store), p.stat().st_mtime_ns) for p in store.rglob("*")) == before
