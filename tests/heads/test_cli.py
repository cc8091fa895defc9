"""CLI round trip on a tiny random BERT: featurize -> train-head -> eval -> grid (click's CliRunner)."""
import json
import random

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from headstore.cli import main

WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river tree stone".split()


def _tiny_bert(folder):
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *"0123456789", *[f"##{d}" for d in "0123456789"]]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab=str(folder / "vocab.txt"), model_max_length=32).save_pretrained(folder)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    BertModel(cfg).eval().save_pretrained(folder, safe_serialization=True)
    return folder


def _sentence(rng, n=6):
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny BEIR dataset, a tiny STS table, and a store holding both."""
    root = tmp_path_factory.mktemp("cli")
    rng = random.Random(0)
    model = _tiny_bert(root / "model")
    beir = root / "beir"
    (beir / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": _sentence(rng, 2), "text": _sentence(rng, 8) + f" {i}"} for i in range(60)]
    (beir / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    queries = [{"_id": f"q{i}", "text": docs[i]["text"].split()[0] + " " + _sentence(rng, 3) + f" {i}"} for i in range(40)]
    (beir / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries) + "\n")
    (beir / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(30)))
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(30, 40)))
    n = 90
    sts = pl.DataFrame({"sentence1": [_sentence(rng) + f" {i}" for i in range(n)],
                        "sentence2": [_sentence(rng) + f" {i}" for i in range(n)],
                        "score": [float(rng.uniform(0, 5)) for _ in range(n)],
                        "split": ["train"] * 50 + ["dev"] * 20 + ["test"] * 20})
    sts.write_parquet(root / "sts.parquet")
    store = root / "store"
    r = CliRunner().invoke(main, ["featurize", "--model", str(model), "--data", str(beir), "--data",
                                  str(root / "sts.parquet"), "--store", str(store), "--dtype", "float32"])
    assert r.exit_code == 0, r.output
    return root, store, beir


def test_train_head_writes_artefacts_and_eval_reproduces_test_metrics(world):
    root, store, beir = world
    out = root / "head"
    r = CliRunner().invoke(main, ["train-head", "--store", str(store), "--data", str(beir), "--out", str(out),
                                  "--loss", "l1-energy", "--epochs", "2", "--batch-size", "8", "--hidden", "16",
                                  "--out-dim", "8", "--no-residual", "--mined-k", "2"])
    assert r.exit_code == 0, r.output
    for name in ("head.safetensors", "config.json", "metrics.json", "curve.png"):
        assert (out / name).is_file(), name
    m = json.loads((out / "metrics.json").read_text())
    assert {"baseline", "head", "dev", "ci", "primary"} <= set(m)
    assert "cosine_ndcg@10" in m["baseline"] and "manhattan_ndcg@10" in m["baseline"]
    assert "manhattan_ndcg@10" in m["head"] and "manhattan_recall@100" in m["head"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["train"]["loss"] == "l1-energy" and cfg["store_fingerprint"]
    r = CliRunner().invoke(main, ["eval", "--store", str(store), "--head", str(out), "--data", str(beir),
                                  "--out", str(root / "eval")])
    assert r.exit_code == 0, r.output
    again = json.loads((root / "eval" / "metrics.json").read_text())
    assert again["head"] == pytest.approx(m["head"])
    assert again["baseline"] == pytest.approx(m["baseline"])


def test_train_head_on_sts_reports_spearman(world):
    root, store, _ = world
    out = root / "sts-head"
    r = CliRunner().invoke(main, ["train-head", "--store", str(store), "--data", str(root / "sts.parquet"),
                                  "--out", str(out), "--loss", "cosent", "--epochs", "2", "--hidden", "16"])
    assert r.exit_code == 0, r.output
    m = json.loads((out / "metrics.json").read_text())
    assert np.isfinite(m["head"]["spearman_manhattan"]) and "spearman_cosine" in m["baseline"]


def test_bad_loss_is_refused_with_the_valid_options(world):
    root, store, beir = world
    r = CliRunner().invoke(main, ["train-head", "--store", str(store), "--data", str(beir), "--out",
                                  str(root / "x"), "--loss", "nope"])
    assert r.exit_code != 0 and "l1-energy" in r.output


def test_train_head_refuses_a_dataset_not_in_the_store(world, tmp_path):
    root, store, beir = world
    other = tmp_path / "other.parquet"
    pl.DataFrame({"sentence1": [f"never seen {i}" for i in range(3)], "sentence2": [f"a b {i}" for i in range(3)],
                  "score": [1.0, 2.0, 3.0], "split": ["train"] * 3}).write_parquet(other)
    r = CliRunner().invoke(main, ["train-head", "--store", str(store), "--data", str(other), "--out", str(tmp_path / "h")])
    assert r.exit_code != 0 and "featurize" in r.output


def test_grid_trains_every_combination_and_resumes(world, tmp_path):
    root, store, beir = world
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nloss = ["l1-energy", "mnr", "cosent"]\nlr = [1e-3, 3e-3]\nseed = [0, 1]\n'
                    '[fixed]\nepochs = 2\nbatch_size = 8\nhidden = 16\n')
    out = tmp_path / "grid"
    r = CliRunner().invoke(main, ["grid", "--store", str(store), "--data", str(beir), "--grid", str(grid), "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = pl.read_parquet(out / "results.parquet")
    assert res.height == 12
    assert res.filter(pl.col("status") == "ok").height == 8  # cosent needs graded labels: skipped, with reason
    assert res.filter(pl.col("status") == "skipped")["reason"].str.contains("cosent").all()
    for name in ("results.csv", "leaderboard.md", "by_setting.png", "best_curves.png"):
        assert (out / name).is_file(), name
    assert "frozen baseline" in (out / "leaderboard.md").read_text()
    # rerun: nothing new to train; a changed grid trains only the new heads
    r = CliRunner().invoke(main, ["grid", "--store", str(store), "--data", str(beir), "--grid", str(grid), "--out", str(out)])
    assert r.exit_code == 0 and pl.read_parquet(out / "results.parquet").height == 12
    grid.write_text(grid.read_text().replace("seed = [0, 1]", "seed = [0, 1, 2]"))
    r = CliRunner().invoke(main, ["grid", "--store", str(store), "--data", str(beir), "--grid", str(grid), "--out", str(out)])
    assert r.exit_code == 0, r.output
    res2 = pl.read_parquet(out / "results.parquet")
    assert res2.height == 18
    kept = res.filter(pl.col("status") == "ok").select("head_id", "test_primary")
    assert kept.join(res2.select("head_id", "test_primary"), on="head_id")["test_primary_right"].to_list() == \
        kept["test_primary"].to_list()
