"""Bad input at evaluation and search, through the CLI (issue 22, items 3, 4, 9, 14; docs/bad-input.md):
a few-shot head on labelled texts, a truncated FAISS index, a test split with no relevant document, and an
--exclude-overlap that removes every item."""
import json
import random
import shutil

import polars as pl
import pytest

from .conftest import FAST, assert_bad_input, cli
from .finetune_world import sentence


@pytest.fixture(scope="module")
def labelled_texts(data_world, tmp_path_factory):
    """Labelled texts (4 classes, 10 train and 4 test texts each) and a float32 store of them."""
    root = tmp_path_factory.mktemp("labelled-texts")
    rng = random.Random(5)
    rows = [{"text": f"{sentence(rng, 5)} c{c} n{i}", "label": f"class{c}", "split": "train" if i < 10 else "test"}
            for c in range(4) for i in range(14)]
    data = root / "texts.parquet"
    pl.DataFrame(rows).write_parquet(data)
    store = root / "store"
    r = cli("featurize", "--model", data_world["model"], "--data", data, "--store", store, "--dtype", "float32")
    assert r.exit_code == 0, r.output
    return data, store


def test_few_shot_train_head_on_labelled_texts_writes_its_curve(labelled_texts, tmp_path):
    """Item 3: a few-shot run has no dev split; its curve is the loss alone (no StopIteration)."""
    data, store = labelled_texts
    out = tmp_path / "head"
    r = cli("train-head", "--store", store, "--data", data, "--shots", "8", "--out", out, *FAST)
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    assert (out / "curve.png").stat().st_size > 0 and (out / "head.safetensors").exists()
    m = json.loads((out / "metrics.json").read_text())
    assert "dev" not in m and m["dev_made"].startswith("few-shot: 8 texts per class")


@pytest.mark.parametrize("damage", ["truncated", "emptied"])
def test_search_on_a_damaged_index_names_the_file(data_world, tmp_path, damage):
    """Item 4: a truncated index.faiss is a one-line error naming it and `cli index`, not a FAISS traceback."""
    pytest.importorskip("faiss")
    idx = tmp_path / "idx"
    r = cli("index", "--store", data_world["store"], "--head", data_world["head"], "--data", data_world["pos"],
            "--out", idx)
    assert r.exit_code == 0, r.output
    faiss_file = idx / "index.faiss"
    whole = faiss_file.read_bytes()
    faiss_file.write_bytes(whole[: len(whole) // 2] if damage == "truncated" else b"")
    r = cli("search", "--index", idx, "--query", "alpha beta", "--k", "3")
    if damage == "emptied":
        assert_bad_input(r, faiss_file, "empty file (0 bytes)", "cli index")
        return
    last = assert_bad_input(r, faiss_file, "not a readable FAISS index", "truncated or damaged", "cli index")
    assert "index_read.cpp" not in last  # FAISS's own source position is left out


def test_a_test_split_with_no_relevant_document_says_so(data_world, tmp_path):
    """Item 9: every test grade 0: the metrics are 0 (trec_eval's rule) and metrics.json and the terminal say
    that no test query has a relevant document."""
    beir = shutil.copytree(data_world["beir"], tmp_path / "beir")
    test = beir / "qrels" / "test.tsv"
    lines = test.read_text().splitlines()
    test.write_text("\n".join([lines[0]] + [line.rsplit("\t", 1)[0] + "\t0" for line in lines[1:]]) + "\n")
    r = cli("eval", "--store", data_world["store"], "--head", data_world["head"], "--data", beir,
            "--out", tmp_path / "ev")
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert m["head"][m["primary"]] == 0 and m["baseline"][m["baseline_primary"]] == 0
    n = m["n_scored"]["test"]
    (warning,) = m["warnings"]
    assert f"no test query has a relevant document (every judgement of its {n} queries has grade <= 0)" in warning
    assert f"WARNING: {warning}" in r.output
    r = cli("eval", "--store", data_world["store"], "--head", data_world["head"], "--data", data_world["beir"],
            "--out", tmp_path / "ev-ok")
    assert r.exit_code == 0 and "WARNING" not in r.output  # judged data: no warning, no key
    assert "warnings" not in json.loads((tmp_path / "ev-ok" / "metrics.json").read_text())


@pytest.mark.parametrize("data, items", [("sts05", "pairs"), ("beir", "queries"), ("pos", "queries")])
def test_exclude_overlap_that_removes_every_item_names_the_file(data_world, tmp_path, data, items):
    """Item 14: excluding the dataset itself leaves nothing to score: the error names the option, its file
    and the split (not `sts_metrics: need two 1-D arrays`)."""
    w = data_world
    r = cli("eval", "--store", w["store"], "--head", w["head"], "--data", w[data], "--exclude-overlap", w[data],
            "--out", tmp_path / "ev")
    assert_bad_input(r, f"--exclude-overlap {w[data]}: every one of the", f"{items} of {w[data]} split 'test'",
                     "nothing is left to score")
    assert not (tmp_path / "ev").exists()
