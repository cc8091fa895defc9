"""Positive pairs plus an unlabeled corpus (`--unlabeled`, issue 42): the unlabeled texts are the distractors every
dev and test anchor ranks its positives against, the pool impostors are mined from and the anchor's sample."""
import json
import random

import numpy as np
import polars as pl
import pytest

from headstore.data.text_id import doc_text, text_id
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.kinds import load_task
from headstore.heads.kinds.ir import KIND as IR
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.training.anchor import anchor_rows_of

from .conftest import FAST, assert_bad_input, cli, write_json_lines
from .finetune_world import sentence

pytrec_eval = pytest.importorskip("pytrec_eval")


@pytest.fixture(scope="module")
def uw(data_world, tmp_path_factory):
    """Positive pairs (train/dev/test) and a BEIR-style corpus file beside them: 30 distractors, 3 texts that are
    test positives, 2 that are test anchors, a duplicate and an empty document; one float32 store of all."""
    root = tmp_path_factory.mktemp("unlabeled")
    rng = random.Random(42)
    anchors = [f"{sentence(rng, 3)} u {i}" for i in range(40)]
    unique = [f"{sentence(rng, 5)} v {i}" for i in range(33)]
    positives = [unique[i % 33] for i in range(40)]  # 7 positives shared by two anchors (a train and a test one)
    splits = ["train"] * 24 + ["dev"] * 8 + ["test"] * 8
    pairs = root / "pairs.parquet"
    pl.DataFrame({"anchor": anchors, "positive": positives, "split": splits}).write_parquet(pairs)
    docs = [{"_id": f"d{i}", "title": sentence(rng, 2), "text": sentence(rng, 7) + f" w {i}"} for i in range(30)]
    docs += [{"_id": f"p{i}", "title": "", "text": positives[32 + i]} for i in range(3)]  # also test positives
    docs += [{"_id": f"a{i}", "text": anchors[33 + i]} for i in range(2)]  # also test anchors
    docs += [{**docs[0], "_id": "dup"}, {"_id": "empty", "title": " ", "text": ""}]
    corpus = write_json_lines(root / "corpus.jsonl", docs)
    store = root / "store"
    r = cli("featurize", "--model", data_world["model"], "--data", pairs, "--unlabeled", corpus, "--store", store,
            "--dtype", "float32")
    assert r.exit_code == 0, r.output
    distractors = [doc_text(d["title"], d["text"]) for d in docs[:30]]
    return {"root": root, "pairs": pairs, "corpus": corpus, "store": store, "anchors": anchors,
            "positives": positives, "splits": splits, "distractors": distractors}


def _run(path) -> dict:
    run: dict = {}
    for line in path.read_text().splitlines():
        qid, _, doc, _, score, _ = line.split()
        assert doc not in run.setdefault(qid, {}), f"{doc} listed twice for {qid}"
        run[qid][doc] = float(score)
    return run


def _qrels(uw, split) -> dict:
    qrels: dict = {}
    for a, p, s in zip(uw["anchors"], uw["positives"], uw["splits"]):
        if s == split:
            qrels.setdefault(text_id(a), {})[text_id(p)] = 1
    return qrels


def test_each_anchor_ranks_positives_and_distractors_as_trec_eval_scores_them(uw, tmp_path):
    out = tmp_path / "h"
    r = cli("train-head", "--store", uw["store"], "--data", uw["pairs"], "--unlabeled", uw["corpus"], "--out", out,
            *FAST)
    assert r.exit_code == 0, r.output
    m = json.loads((out / "metrics.json").read_text())
    corpus = {text_id(t) for t in uw["positives"] + uw["distractors"]}  # a plain set: each text once
    u = m["unlabeled"]
    assert (u["texts"], u["also_positives"], u["also_anchors"], u["duplicates"], u["skipped_empty"]) == (35, 3, 2, 1, 1)
    assert u["corpus"] == len(corpus) == 33 + 30 and set(u["roles"]) == {"distractors", "impostors", "anchor"}
    assert "unlabeled: 35 texts" in r.output and "distractors, impostors, anchor" in r.output  # the terminal
    for split, block in (("test", m["head"]), ("dev", m["dev"]["head"])):
        run, qrels = _run(out / f"run.{split}.trec"), _qrels(uw, split)
        assert set(run) == set(qrels)
        for qid, docs in run.items():  # every query ranked the whole corpus (63 < 100), each document once,
            assert set(docs) == corpus  # and the unlabeled texts equal to anchors in no list
        per_query = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
        ndcg = np.mean([q["ndcg_cut_10"] for q in per_query.values()])
        assert ndcg == pytest.approx(block["manhattan_ndcg@10"], abs=1e-6)
        assert np.mean([q["recall_100"] for q in per_query.values()]) == pytest.approx(1.0)


def test_frozen_baseline_ranks_the_corpus_a_plain_loop_builds(uw, tmp_path):
    """cli eval with --unlabeled: the frozen cosine baseline's nDCG@10 on test equals pytrec_eval's on a run made
    by a plain loop: each test anchor against every positive of the table and every distractor, by cosine."""
    head = tmp_path / "h"
    assert cli("train-head", "--store", uw["store"], "--data", uw["pairs"], "--out", head, *FAST).exit_code == 0
    r = cli("eval", "--store", uw["store"], "--head", head, "--data", uw["pairs"], "--unlabeled", uw["corpus"],
            "--out", tmp_path / "e")
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert set(m["unlabeled"]["roles"]) == {"distractors"} and m["unlabeled"]["corpus"] == 63
    store = FeatureStore.open(uw["store"])
    docs = list(dict.fromkeys(uw["positives"] + uw["distractors"]))
    feats = lambda texts: store.features(store.rows_for([text_id(t) for t in texts])).astype(np.float64)  # noqa: E731
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    queries = list(dict.fromkeys(a for a, s in zip(uw["anchors"], uw["splits"]) if s == "test"))
    sims = unit(feats(queries)) @ unit(feats(docs)).T  # (Q, N)
    top = np.sort(sims, axis=1)[:, ::-1][:, :11]
    assert np.diff(top, axis=1).max() < -1e-6  # no near-tie inside any top 10: the order is float-proof
    run = {text_id(q): {text_id(d): float(s) for d, s in zip(docs, row)} for q, row in zip(queries, sims)}
    per_query = pytrec_eval.RelevanceEvaluator(_qrels(uw, "test"), {"ndcg_cut.10"}).evaluate(run)
    want = np.mean([q["ndcg_cut_10"] for q in per_query.values()])
    assert m["baseline"]["cosine_ndcg@10"] == pytest.approx(want, abs=1e-9)


def test_the_corpus_is_the_mining_pool_and_the_anchor_sample(uw):
    store = FeatureStore.open(uw["store"])
    task = load_task(str(uw["pairs"]), store, unlabeled=(str(uw["corpus"]),))
    rows = lambda texts: set(store.rows_for([text_id(t) for t in texts]).tolist())  # noqa: E731
    assert set(task.corpus_rows.tolist()) == rows(uw["positives"] + uw["distractors"])
    train = rows([t for a, p, s in zip(uw["anchors"], uw["positives"], uw["splits"]) if s == "train" for t in (a, p)])
    anchor = anchor_rows_of(store, task, 2.0)
    # the anchors' texts left out, and the training texts (two of the three test positives are train ones too)
    assert set(anchor.rows.tolist()) == rows(uw["distractors"] + uw["positives"][32:35]) - train
    assert anchor.report["training_texts_left_out"] == 2 and anchor.report["from"] == "the --unlabeled texts"
    named = anchor_rows_of(store, task, 2.0, str(uw["pairs"]))
    scored = rows([a for a, s in zip(uw["anchors"], uw["splits"]) if s != "train"])  # dev and test queries
    assert set(named.rows.tolist()) == rows(uw["anchors"] + uw["positives"]) - train - scored  # never one of them
    assert named.report["dev_test_texts_left_out"] == len(scored)
    alone = load_task(str(uw["pairs"]), store)  # without: each split ranks its own positives, mines train's
    assert len(alone.eval_sets["test"].doc_ids) == len(set(uw["positives"][32:]))


def test_guard_names_settings_to_change_never_those_in_use(uw):
    store = FeatureStore.open(uw["store"])
    alone = load_task(str(uw["pairs"]), store)
    said = IR.suggest(alone, HeadConfig(), TrainConfig(anchor_weight=2.0))
    assert said.startswith("--unlabeled CORPUS") and "--depth 1" in said and "defaults" not in said
    assert "--depth 2" not in said and "--lr 3e-3" not in said and "--remine" not in said
    assert "--anchor-weight 3 with it" in said  # the anchor needs texts of their own: the --unlabeled ones
    joined = load_task(str(uw["pairs"]), store, unlabeled=(str(uw["corpus"]),))
    said = IR.suggest(joined, HeadConfig(depth=1), TrainConfig(lr=1e-3, loss="mnr"))
    assert "--unlabeled" not in said and "--depth 1" not in said and "--lr 1e-3" not in said and "mnr" not in said
    assert "--q 12" in said and "--anchor-weight 3" in said


def test_grid_and_index_take_the_unlabeled_texts(uw, tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nlr = [1e-3]\n[fixed]\nepochs = 1\nhidden = 16\nbatch_size = 8\nmined_k = 2\n')
    ids, said = {}, {}
    for name, extra in (("with", ("--unlabeled", uw["corpus"])), ("without", ())):
        r = cli("grid", "--store", uw["store"], "--data", uw["pairs"], "--grid", grid, "--out", tmp_path / name, *extra)
        assert r.exit_code == 0, r.output
        ids[name], said[name] = pl.read_parquet(tmp_path / name / "results.parquet")["head_id"][0], r.output
    assert "unlabeled: 35 texts" in said["with"] and "unlabeled:" not in said["without"]
    said = json.loads((tmp_path / "with" / "baseline.json").read_text())["features"]["unlabeled"]
    assert said["corpus"] == 63 and {"distractors", "impostors"} == set(said["roles"])  # a grid's anchor is off
    assert ids["with"] != ids["without"]  # the texts that made a head are part of its id
    r = cli("index", "--store", uw["store"], "--head", tmp_path / "with#rank=1", "--data", uw["pairs"],
            "--unlabeled", uw["corpus"], "--out", tmp_path / "idx")
    assert r.exit_code == 0, r.output
    items = pl.read_parquet(tmp_path / "idx" / "items.parquet")
    want = set(uw["anchors"] + uw["positives"] + uw["distractors"])  # the pairs' texts, then the new ones
    assert items["text"].n_unique() == items.height and set(items["text"].to_list()) == want


def test_bad_unlabeled_input_is_one_line(uw, data_world, tmp_path):
    base = ("train-head", "--store", uw["store"], "--data", uw["pairs"], "--out", tmp_path / "h", *FAST)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert_bad_input(cli(*base, "--unlabeled", empty), f"{empty}: empty file (0 bytes)")
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"one\ntwo\ncaf\xe9\n")
    assert_bad_input(cli(*base, "--unlabeled", latin), f"{latin}:3: not valid UTF-8")
    new = tmp_path / "new.txt"
    new.write_text(uw["distractors"][0] + "\nnever featurized one\nnever featurized two\n")
    last = assert_bad_input(cli(*base, "--unlabeled", new), f"{new}:2: 2 of the 3 unlabeled texts are not in the "
                            f"feature store {uw['store']}")
    assert f"cli featurize --model MODEL --store {uw['store']} --unlabeled {new}" in last
    sts = ("train-head", "--store", data_world["store"], "--data", data_world["sts05"], "--out", tmp_path / "s", *FAST)
    pos = data_world["pos"]  # texts of the store, but an STS head with no anchor gives them no role
    table = pl.read_parquet(pos)
    (tmp_path / "t.txt").write_text("\n".join(table["positive"].unique().to_list()[:5]) + "\n")
    assert_bad_input(cli(*sts, "--unlabeled", tmp_path / "t.txt"), "play no role", "--anchor-weight")
    assert not (tmp_path / "h").exists()  # nothing written


def test_featurize_adds_the_unlabeled_texts_once(uw, data_world, tmp_path):
    extra = tmp_path / "more.txt"
    extra.write_text("a brand new text\n" + uw["distractors"][1] + "\n")
    store = tmp_path / "s"
    r = cli("featurize", "--model", data_world["model"], "--unlabeled", extra, "--store", store, "--dtype", "float32")
    assert r.exit_code == 0, r.output
    assert FeatureStore.open(store).n_texts == 2
    r = cli("featurize", "--model", data_world["model"], "--unlabeled", extra, "--store", store, "--dtype", "float32")
    assert r.exit_code == 0 and FeatureStore.open(store).n_texts == 2  # a rerun is a no-op
    assert_bad_input(cli("featurize", "--model", data_world["model"], "--store", store, "--dtype", "float32"),
                     "no --data or --unlabeled")


def test_dev_is_carved_by_anchor_text_when_pairs_rank_a_shared_corpus(uw, tmp_path):
    """Without a dev split, positive pairs with --unlabeled hold out dev by anchor text alone, as a BEIR folder
    holds out queries: dev positives may be train positives (the corpus is shared, as for test)."""
    table = pl.read_parquet(uw["pairs"]).drop("split")
    table.write_parquet(tmp_path / "nosplit.parquet")
    store = FeatureStore.open(uw["store"])
    task = load_task(str(tmp_path / "nosplit.parquet"), store, unlabeled=(str(uw["corpus"]),))
    dev = task.eval_sets["dev"]
    train_anchors = set(task.train.anchor.tolist())
    assert not set(dev.query_rows.tolist()) & train_anchors and len(dev.query_ids) >= 3
    assert set(dev.doc_ids) == {text_id(t) for t in uw["positives"] + uw["distractors"]}
    assert "held out by anchor text" in task.dev_note and "shared corpus" in task.dev_note
    alone = load_task(str(tmp_path / "nosplit.parquet"), store)  # without: by both texts, as before
    assert "held out by text" in alone.dev_note and "anchor" not in alone.dev_note


def test_an_sts_tables_dev_and_test_sentences_are_never_its_unlabeled_sample(data_world, tmp_path):
    """Kinds other than IR only train on unlabeled texts: second-column dev and test sentences of an STS table in the
    --unlabeled file are left out and counted (first-column ones are anchors, counted so already); the other texts
    are the sample, and the anchor regulariser draws from them alone."""
    frame = pl.read_parquet(data_world["sts05"])
    held = [*frame.filter(pl.col("split") == "dev")["sentence2"][:2], frame.filter(pl.col("split") == "test")
            ["sentence2"][0]]
    first = frame.filter(pl.col("split") == "test")["sentence1"][0]
    others = list(dict.fromkeys(pl.read_parquet(data_world["pos"])["positive"]))[:6]
    path = tmp_path / "unlabeled.txt"
    path.write_text("\n".join([*held, first, *others]) + "\n")
    store = FeatureStore.open(data_world["store"])
    task = load_task(str(data_world["sts05"]), store, unlabeled=(str(path),))
    report = task.unlabeled.report
    assert (report["texts"], report["also_dev_test"], report["also_anchors"]) == (10, 3, 1), report
    assert sorted(task.unlabeled.rows) == sorted(store.rows_for(store.row_ids(others, "document")))
    out = tmp_path / "h"
    r = cli("train-head", "--store", data_world["store"], "--data", data_world["sts05"], "--unlabeled", path,
            "--anchor-weight", "0.1", "--out", out, *FAST)
    assert r.exit_code == 0, r.output
    assert "3 dev or test texts (left out: never trained on)" in r.output
    assert json.loads((out / "metrics.json").read_text())["unlabeled"]["also_dev_test"] == 3
