"""The lexical channel (BM25 fused with the dense scores, heads.scoring.lexical / heads.training.lexical_fit): its
scores against Lucene's formula written as a loop, the fusion's arithmetic, the memory's gain, train-head / eval
on a tiny model, and its bad inputs."""
from __future__ import annotations

import json
import math
import random
import re
import statistics

import numpy as np
import pytest
import torch

pytest.importorskip("bm25s")

from headstore.heads.artefacts.memory import PlacedMemory  # noqa: E402
from headstore.heads.kinds.ranking import IRSplit  # noqa: E402
from headstore.heads.scoring.lexical import Bm25Config, Bm25Index, fused, per_query_scaled  # noqa: E402
from headstore.heads.training.lexical_fit import LEXICAL_FILE, gained_dense, one_se  # noqa: E402

from .conftest import assert_bad_input, cli  # noqa: E402
from .finetune_world import sentence, tiny_bert, tiny_sts  # noqa: E402

DOCS = ["apple banana apple cherry", "banana date", "cherry cherry cherry elder fig", "apple fig grape honeydew",
        "Grape, GRAPES and an apple!", "proteins folding", "protein"]
STEMS = {"grapes": "grape", "proteins": "protein", "folding": "fold", "cherry": "cherri"}  # Snowball English's, by hand


def lucene_bm25(docs: list[str], query: list[str], k1: float = 1.2, b: float = 0.75) -> list[float]:
    """Lucene's BM25 (8.x: idf = ln(1 + (N - df + 0.5) / (df + 0.5)), tf / (tf + k1 (1 - b + b dl / avgdl))) as a
    loop, on lower-cased words of two or more letters, English stop words out ("and", "an"), stemmed (STEMS)."""
    stop = {"and", "an", "the", "of", "a"}
    tokens = [[STEMS.get(w, w) for w in re.findall(r"(?u)\b\w\w+\b", d.lower()) if w not in stop] for d in docs]
    query = [STEMS.get(w, w) for w in query]
    n, avg = len(docs), sum(map(len, tokens)) / len(docs)
    out = []
    for t in tokens:
        score = 0.0
        for w in query:
            df = sum(w in x for x in tokens)
            tf = t.count(w)
            score += math.log(1 + (n - df + 0.5) / (df + 0.5)) * tf / (tf + k1 * (1 - b + b * len(t) / avg))
        out.append(score)
    return out


def test_bm25_scores_equal_lucenes_formula_written_as_a_loop():
    index = Bm25Index(DOCS, Bm25Config())
    got = index.scores(["Apple cherry", "grape", "the and of", "protein"]).numpy()  # (4, 7)
    assert got.shape == (4, len(DOCS))
    assert np.allclose(got[0], lucene_bm25(DOCS, ["apple", "cherry"]), atol=1e-6)
    assert np.allclose(got[1], lucene_bm25(DOCS, ["grape"]), atol=1e-6)
    assert got[1][4] > got[1][3] > 0  # "GRAPES" meets "grape": two of them
    assert not got[2].any()  # stop words only: no evidence anywhere
    assert got[3][5] > 0 and got[3][6] > 0 and not got[3][:5].any()  # "proteins" is "protein"
    unstemmed = Bm25Index(DOCS, Bm25Config(stemmer="")).scores(["protein"]).numpy()
    assert unstemmed[0][6] > 0 and unstemmed[0][5] == 0


def test_a_bad_stemmer_is_one_line_listing_the_valid_ones():
    with pytest.raises(ValueError, match="stemmer 'klingon'; valid: .*'english'"):
        Bm25Config(stemmer="klingon")


def test_one_se_takes_the_simplest_candidate_dev_cannot_tell_from_the_best():
    gen = np.random.default_rng(0)
    best = gen.uniform(0.5, 1.0, 80)  # (Q,) per-query dev values
    noise = gen.normal(0, 0.05, 80)
    near, far = best - 0.002 + noise, best - 0.2 + 0.01 * noise  # a tiny loss with a wide spread; a large one
    got = one_se([near, best, far])
    for cand, ok in zip([near, best, far], got):
        gap = best - cand  # the reference: a paired standard error written out
        se = math.sqrt(sum((g - gap.mean()) ** 2 for g in gap) / (len(gap) - 1) / len(gap))
        assert ok == (gap.mean() <= se + 1e-12)
    assert got.tolist() == [True, True, False]


def test_fusion_scales_each_query_by_its_own_spread_and_weight_0_is_the_dense_ranking():
    gen = torch.Generator().manual_seed(0)
    dense, lexical = torch.randn(4, 9, generator=gen), torch.rand(4, 9, generator=gen) * 30
    lexical[3] = 0  # a query with no lexical evidence
    ref = dense.numpy() / dense.numpy().std(axis=1, ddof=1, keepdims=True)
    assert np.allclose(per_query_scaled(dense).numpy(), ref, atol=1e-6)
    lex_ref = lexical.numpy()[:3] / lexical.numpy()[:3].std(axis=1, ddof=1, keepdims=True)
    out = fused(dense, lexical, 0.3).numpy()
    assert np.allclose(out[:3], ref[:3] + 0.3 * lex_ref, atol=1e-5)
    assert np.allclose(out[3], ref[3], atol=1e-6)  # its row keeps the dense order
    assert torch.equal(fused(dense, lexical, 0.0), dense)


def test_the_memorys_gain_scales_its_change_of_score_and_leaves_other_documents_bit_for_bit():
    gen = torch.Generator().manual_seed(1)
    X = torch.nn.functional.normalize(torch.randn(8, 6, generator=gen), dim=1)  # rows 0-2 queries, 3-7 documents
    split = IRSplit(["q0", "q1", "q2"], np.arange(3), [f"d{i}" for i in range(5)], np.arange(3, 8), {})
    moved = torch.nn.functional.normalize(X[[4, 6]] + X[[0, 1]], dim=1)
    placed = PlacedMemory(np.array([4, 6]), moved, "features")
    of_gain = gained_dense(split, X, None, None, placed, "cosine")
    docs_moved = torch.cat([X[3:4], moved[:1], X[5:6], moved[1:], X[7:]])
    plain, with_memory = X[:3] @ X[3:].T - 1, X[:3] @ docs_moved.T - 1  # minus the cosine energy (1 - cos)
    assert torch.allclose(of_gain(0.0), plain, atol=1e-6) and torch.allclose(of_gain(1.0), with_memory, atol=1e-6)
    assert torch.allclose(of_gain(2.0), plain + 2 * (with_memory - plain), atol=1e-6)
    assert torch.equal(of_gain(2.0)[:, [0, 2, 4]], of_gain(0.0)[:, [0, 2, 4]])  # documents it does not hold


def lexical_beir(folder, seed: int = 3):
    """A BEIR folder where BM25 has the answer a random encoder has not: each document carries one rare word,
    each query asks with it; training judges documents 0-9, dev 10-19, test 0-4 (seen) and 20-29 (unseen)."""
    rng = random.Random(seed)
    (folder / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": "", "text": f"{sentence(rng, 8)} zq{i}rare"} for i in range(30)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    queries = {f"q{i}": f"{sentence(rng, 3)} zq{i}rare" for i in range(30)}
    queries.update({f"s{i}": f"{sentence(rng, 3)} zq{i}rare" for i in range(5)})
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    head = "query-id\tcorpus-id\tscore\n"
    qrels = {"train": [(f"q{i}", i) for i in range(10)], "dev": [(f"q{i}", i) for i in range(10, 20)],
             "test": [(f"s{i}", i) for i in range(5)] + [(f"q{i}", i) for i in range(20, 30)]}
    for split, pairs in qrels.items():
        (folder / "qrels" / f"{split}.tsv").write_text(head + "".join(f"{q}\td{d}\t1\n" for q, d in pairs))
    return folder


@pytest.fixture(scope="module")
def lw(tmp_path_factory):
    from headstore.featurize.encoder.config import FeaturizeConfig
    from headstore.featurize.run.local import featurize

    root = tmp_path_factory.mktemp("lexical-world")
    beir, sts = lexical_beir(root / "beir"), tiny_sts(root / "sts.parquet")
    featurize(FeaturizeConfig(model=str(tiny_bert(root / "model", layers=2)), dtype="float32", batch_tokens=2048),
              [str(beir), str(sts)], root / "store")
    r = cli("train-head", "--store", root / "store", "--data", beir, "--out", root / "head", "--epochs", "2",
            "--batch-size", "4", "--hidden", "16")
    assert r.exit_code == 0, r.output
    return root, beir, sts, json.loads((root / "head" / "metrics.json").read_text()), r.output


def test_train_head_keeps_bm25_where_dev_says_so_and_eval_applies_it(lw, tmp_path):
    root, beir, _, metrics, output = lw
    block = metrics["lexical"]
    assert block["fit"]["kept"] and block["fit"]["weight"] > 0 and (root / "head" / LEXICAL_FILE).is_file()
    assert block["fit"]["dev"] > block["fit"]["dev_without"]
    test = block["test"]
    assert test["fused"] > test["dense"] and test["parts"]["counts"] == {"seen": 5, "unseen": 10, "all": 15}
    assert "lexical: BM25 weight" in output
    r = cli("eval", "--store", root / "store", "--head", root / "head", "--data", beir, "--out", tmp_path / "on")
    assert r.exit_code == 0, r.output
    on = json.loads((tmp_path / "on" / "metrics.json").read_text())["lexical"]["test"]
    assert on["fused"] == pytest.approx(test["fused"]) and on["frozen+lexical"] == pytest.approx(test["frozen+lexical"])
    import polars as pl

    judged = pl.read_parquet(root / "head" / "judgements.parquet")["document_id"].unique().to_list()
    assert on["judged_documents"] == len(judged) > 0 and on["weight"] == block["fit"]["weight"]  # its own corpus
    r = cli("eval", "--store", root / "store", "--head", root / "head", "--data", beir, "--out", tmp_path / "off",
            "--no-lexical")
    assert r.exit_code == 0 and "lexical" not in json.loads((tmp_path / "off" / "metrics.json").read_text())


def test_lexical_asked_for_where_it_cannot_be_and_a_broken_file_are_one_line(lw, tmp_path):
    root, beir, sts, _, _ = lw
    assert_bad_input(cli("train-head", "--store", root / "store", "--data", sts, "--out", tmp_path / "h",
                         "--lexical", "--epochs", "1"), "--lexical", "no IR dataset")
    assert not (tmp_path / "h").exists()
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in (root / "head").iterdir():
        if f.is_file():
            (broken / f.name).write_bytes(f.read_bytes())
    (broken / LEXICAL_FILE).write_text('{"config": {"kind": "bm25", "k1": "x"')  # cut short
    assert_bad_input(cli("eval", "--store", root / "store", "--head", broken, "--data", beir, "--out",
                         tmp_path / "e1"), LEXICAL_FILE, "not a lexical channel's settings")
    saved = json.loads((root / "head" / LEXICAL_FILE).read_text())
    (broken / LEXICAL_FILE).write_text(json.dumps({**saved, "version": 0}))
    assert_bad_input(cli("eval", "--store", root / "store", "--head", broken, "--data", beir, "--out",
                         tmp_path / "e2"), LEXICAL_FILE, "lexical version 0")
    (broken / LEXICAL_FILE).write_text(json.dumps({**saved, "weight": -1}))
    assert_bad_input(cli("eval", "--store", root / "store", "--head", broken, "--data", beir, "--out",
                         tmp_path / "e3"), LEXICAL_FILE, "weight must be numbers >= 0")
    (broken / LEXICAL_FILE).write_text(json.dumps({**saved, "config": {**saved["config"], "stemmer": "klingon"}}))
    assert_bad_input(cli("eval", "--store", root / "store", "--head", broken, "--data", beir, "--out",
                         tmp_path / "e5"), LEXICAL_FILE, "stemmer 'klingon'; valid")
    (broken / LEXICAL_FILE).write_text(json.dumps({k: v for k, v in saved.items() if k != "weight_new"}))
    assert_bad_input(cli("eval", "--store", root / "store", "--head", broken, "--data", beir, "--out",
                         tmp_path / "e6"), LEXICAL_FILE, "weight_new must be numbers >= 0")
    (broken / LEXICAL_FILE).unlink()
    assert_bad_input(cli("eval", "--store", root / "store", "--head", broken, "--data", beir, "--out",
                         tmp_path / "e4", "--lexical"), "--lexical", "has no lexical.json")
    assert not any((tmp_path / f"e{i}").exists() for i in range(1, 7))


def test_search_ranks_by_eval_s_fused_score_and_export_writes_the_channel_beside(lw, tmp_path):
    from headstore.heads.apply.search import SearchIndex
    from headstore.heads.scoring.ir_metrics import ir_metrics_per_query

    root, beir, _, metrics, _ = lw
    r = cli("index", "--store", root / "store", "--head", root / "head", "--data", beir, "--out", tmp_path / "idx")
    assert r.exit_code == 0, r.output
    info = json.loads((tmp_path / "idx" / "index.json").read_text())
    assert info["lexical"]["weight"] == metrics["lexical"]["fit"]["weight"]
    queries = {q["_id"]: q["text"] for q in map(json.loads, (beir / "queries.jsonl").read_text().splitlines())}
    qrels = {}
    for line in (beir / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        q, d, g = line.split("\t")
        qrels.setdefault(q, {})[d] = int(g)
    ids = sorted(qrels)
    for lexical, expect in ((True, metrics["lexical"]["test"]["fused"]), (False, metrics["lexical"]["test"]["dense"])):
        hits = SearchIndex(tmp_path / "idx", lexical=lexical).search([queries[q] for q in ids], 30)
        _, per_query = ir_metrics_per_query({q: [h["id"] for h in h_] for q, h_ in zip(ids, hits)}, qrels, (10,))
        # the corpus (30) is within the candidates: search ranks every document as eval does (queries through the
        # encoder here, stored features there: float32 both)
        assert float(per_query["ndcg@10"].mean()) == pytest.approx(expect, abs=1e-6)
    r = cli("export", "--head", root / "head", "--format", "sentence-transformers", "--out", tmp_path / "st")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "st" / LEXICAL_FILE).read_text() == (root / "head" / LEXICAL_FILE).read_text()
    assert "no corpus to run BM25 on" in r.output


def test_a_damaged_bm25_index_beside_the_faiss_one_is_one_line(lw, tmp_path):
    root, beir, _, _, _ = lw
    assert cli("index", "--store", root / "store", "--head", root / "head", "--data", beir, "--out",
               tmp_path / "idx").exit_code == 0
    bm25 = tmp_path / "idx" / "lexical" / "bm25"
    next(p for p in bm25.iterdir() if p.name.startswith("indptr")).write_bytes(b"\x93NUMPY")  # cut short
    assert_bad_input(cli("search", "--index", tmp_path / "idx", "--query", "zq3rare"), "bm25",
                     "not a readable BM25 index")


def test_auto_skips_the_channel_without_bm25s_and_on_says_so(lw, monkeypatch):
    from headstore.featurize.store.reader import FeatureStore
    from headstore.heads.kinds import load_task
    from headstore.heads.training import lexical_fit

    root, beir, _, _, _ = lw
    task = load_task(str(beir), FeatureStore.open(str(root / "store")))
    assert lexical_fit.wanted(task, "auto") and not lexical_fit.wanted(task, "off")
    monkeypatch.setattr(lexical_fit, "_has_bm25s", lambda: False)
    assert not lexical_fit.wanted(task, "auto")
    with pytest.raises(ValueError, match="bm25s or PyStemmer is not installed"):
        lexical_fit.wanted(task, "on")
    with pytest.raises(ValueError, match="valid"):
        lexical_fit.wanted(task, "maybe")


def test_a_run_without_the_lexical_channel_holds_no_split_texts(lw, tmp_path, monkeypatch):
    """The splits' texts (a 1M-document corpus's: ~0.13 GB) serve BM25 alone: train-head with --no-lexical trains,
    evaluates and fits its memory on a task that holds none; with the channel it has them."""
    import headstore.heads.training.run as run

    seen = []
    real = run.evaluate_head
    monkeypatch.setattr(run, "evaluate_head", lambda task, *a, **k: seen.append(task) or real(task, *a, **k))
    root, beir, _, _, _ = lw
    for flag in ("--no-lexical", "--lexical"):
        r = cli("train-head", "--store", root / "store", "--data", beir, "--out", tmp_path / flag, "--epochs", "1",
                "--batch-size", "4", "--hidden", "16", flag)
        assert r.exit_code == 0, r.output
    off, on = seen
    assert {name: s.texts for name, s in off.eval_sets.items()} == {"dev": None, "test": None}
    assert all(isinstance(s.texts["document"], dict) and s.texts["document"] for s in on.eval_sets.values())


def test_the_new_corpus_weight_is_chosen_on_the_unseen_dev_queries_and_applied_where_the_memory_knows_none():
    from types import SimpleNamespace

    from headstore.heads.training.lexical_fit import WEIGHTS, applied_weight, new_corpus_weight

    gen = torch.Generator().manual_seed(4)
    n_q, n_d = 6, 12  # queries 0-2 seen (their document, 0-2, judged in training), 3-5 unseen (documents 3-5)
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(n_q)}
    dev = IRSplit([f"q{i}" for i in range(n_q)], np.arange(n_q), [f"d{i}" for i in range(n_d)],
                  np.arange(100, 100 + n_d), qrels)
    task = SimpleNamespace(eval_sets={"dev": dev}, train=SimpleNamespace(positive=np.array([100, 101, 102])))
    plain = torch.randn(n_q, n_d, generator=gen)  # the dense channel ranks the unseen queries' documents last
    lexical = torch.rand(n_q, n_d, generator=gen) * 0.1
    for i in range(n_q):
        plain[i, i] = plain[i].max() - 0.25 * abs(i - 2)  # second or lower
        lexical[i, i] = 1.0  # BM25 ranks each query's document first
    got = new_corpus_weight(task, lexical, plain, 0.2, memory=True)
    assert got["dev_new_queries"] == 3

    def ndcg(w: float) -> list[float]:  # the reference: numpy's ranks of the fused score, one relevant document
        p, lx = plain.numpy().astype(np.float64), lexical.numpy().astype(np.float64)
        score = p if w == 0 else p / p.std(1, ddof=1, keepdims=True) + w * lx / lx.std(1, ddof=1, keepdims=True)
        ranks = [int((score[i] > score[i, i]).sum()) + 1 for i in range(3, n_q)]  # the unseen queries'
        return [1 / math.log2(r + 1) if r <= 10 else 0.0 for r in ranks]

    means = {w: sum(ndcg(w)) / 3 for w in WEIGHTS}
    best = max(WEIGHTS, key=lambda w: means[w])
    gaps = {w: [a - b for a, b in zip(ndcg(best), ndcg(w))] for w in WEIGHTS}
    se = {w: statistics.stdev(g) / math.sqrt(3) for w, g in gaps.items()}
    assert got["weight_new"] == min(w for w in WEIGHTS if means[best] - means[w] <= se[w] + 1e-12)
    assert got["dev_new"] == pytest.approx(means[got["weight_new"]])
    assert 0 < got["weight_new"] < max(WEIGHTS)  # the toy's flip lies inside the grid
    assert new_corpus_weight(task, lexical, plain, 0.2, memory=False)["weight_new"] == 0.2  # no memory: `weight`
    fit = {"weight": 0.2, "weight_new": got["weight_new"]}
    assert applied_weight(fit, 5) == 0.2 and applied_weight(fit, 0) == got["weight_new"]
    assert applied_weight(fit, None) == 0.2  # not known (a head without its judgements): the dev weight
