"""Prompts and roles: BEIR queries are encoded under the query prompt and documents under the document prompt,
one text used as both is two rows, each equal to `SentenceTransformer(dir).encode(text, prompt=...)`; every
reader takes the row of the right role; Pipeline, search and export follow; other prompts are refused."""
from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from arch_models import build_hf, build_st
from click.testing import CliRunner

from headstore.cli import main
from headstore.data.text_id import row_id, text_id
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.run.local import featurize
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.store.layout import StoreError
from headstore.heads.kinds import load_task

pytest.importorskip("sentence_transformers")

PROMPTS = {"query": "find the river: ", "document": "the stone: "}
SHARED = "cat sat on the mat near the river"  # a query of the test split and a document of the corpus


def beir(folder):
    (folder / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": "", "text": f"{w} dog ran far away {i}"} for i, w in enumerate(
        "the a cat dog house tree river blue green red small large".split())]
    docs.append({"_id": "dshared", "title": "", "text": SHARED})
    queries = [{"_id": f"q{i}", "text": f"{w} house {i}"} for i, w in enumerate("the a cat dog tree river blue red small".split())]
    queries.append({"_id": "qshared", "text": SHARED})
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    head = "query-id\tcorpus-id\tscore\n"
    (folder / "qrels" / "train.tsv").write_text(head + "".join(f"q{i}\td{i}\t1\n" for i in range(5)))
    (folder / "qrels" / "dev.tsv").write_text(head + "q5\td5\t1\nq6\td6\t1\nq7\td7\t1\n")
    (folder / "qrels" / "test.tsv").write_text(head + "q8\td8\t1\nqshared\td0\t1\n")
    return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompts")
    hf = build_hf(root / "hf", "bert")
    return {"root": root, "hf": hf, "st": build_st(root / "st", hf, "mean", None, True, prompts=PROMPTS),
            "st_excl": build_st(root / "st-excl", hf, "cls", None, False, include_prompt=False, prompts=PROMPTS),
            "beir": beir(root / "beir")}


@pytest.mark.parametrize("model", ["st", "st_excl"])
def test_one_text_two_roles_two_rows_each_as_sentence_transformers(world, model, tmp_path):
    from sentence_transformers import SentenceTransformer

    featurize(FeaturizeConfig(model=str(world[model]), dtype="float32"), [world["beir"]], tmp_path / "s")
    store = FeatureStore.open(tmp_path / "s")
    assert store.prompts == PROMPTS  # the model's own prompts, named query and document
    q_row, d_row = store.rows_for([row_id(SHARED, PROMPTS["query"])])[0], store.rows_for([row_id(SHARED, PROMPTS["document"])])[0]
    assert q_row != d_row
    assert store.find_rows([text_id(SHARED)])[0] == -1  # never stored without its prompt
    st = SentenceTransformer(str(world[model]), device="cpu")
    for row, name in ((q_row, "query"), (d_row, "document")):
        expected = st.encode([SHARED], prompt_name=name, convert_to_numpy=True)[0]
        assert np.abs(store.features([row])[0] - expected).max() <= 1e-5
    # the task reads queries in the query role and documents in the document role
    task = load_task(str(world["beir"]), store)
    test = task.eval_sets["test"]
    assert test.query_rows[test.query_ids.index("qshared")] == q_row
    assert test.doc_rows[test.doc_ids.index("dshared")] == d_row
    assert set(task.train.anchor.tolist()) == set(store.rows_for(store.row_ids([f"{w} house {i}" for i, w in
                                                                              enumerate("the a cat dog tree".split())], "query")).tolist())


def test_other_prompts_are_refused_and_unknown_prompt_names_listed(world, tmp_path):
    featurize(FeaturizeConfig(model=str(world["st"]), dtype="float32"), [world["beir"]], tmp_path / "s")
    with pytest.raises(StoreError, match="prompts"):
        featurize(FeaturizeConfig(model=str(world["st"]), query_prompt="other: ", dtype="float32"),
                  [world["beir"]], tmp_path / "s")
    with pytest.raises(ValueError, match=r"--prompt-name 'sts'.*\['document', 'query'\]"):
        featurize(FeaturizeConfig(model=str(world["st"]), prompt_name="sts"), [world["beir"]], tmp_path / "t")
    # a model without prompts, and a store made before prompts: no "prompts" part, ids are text ids
    featurize(FeaturizeConfig(model=str(world["hf"]), dtype="float32"), [world["beir"]], tmp_path / "plain")
    plain = FeatureStore.open(tmp_path / "plain")
    assert "prompts" not in plain.manifest and plain.find_rows([text_id(SHARED)])[0] >= 0


def test_asymmetric_pairs_need_the_same_roles_to_read(world, tmp_path):
    pairs = tmp_path / "pairs.parquet"
    pl.DataFrame({"anchor": [f"dog house {i}" for i in range(11)] + [SHARED],
                  "positive": [f"cat tree {i}" for i in range(11)] + ["red river"],
                  "split": ["train"] * 5 + ["dev"] * 3 + ["test"] * 4}).write_parquet(pairs)
    r = CliRunner().invoke(main, ["featurize", "--model", str(world["st"]), "--data", str(pairs), "--store",
                                  str(tmp_path / "s"), "--dtype", "float32", "--pair-roles", "query-document"])
    assert r.exit_code == 0, r.output
    store = FeatureStore.open(tmp_path / "s")
    asym = load_task(str(pairs), store, "pairs?roles=query-document")
    assert asym.train.anchor.tolist() == store.rows_for(store.row_ids([f"dog house {i}" for i in range(5)], "query")).tolist()
    assert asym.train.positive.tolist() == store.rows_for(store.row_ids([f"cat tree {i}" for i in range(5)])).tolist()
    with pytest.raises(ValueError, match="not in the feature store.*same --pair-roles"):
        load_task(str(pairs), store)  # read as symmetric: anchors were never encoded as documents
    r = CliRunner().invoke(main, ["train-head", "--store", str(tmp_path / "s"), "--data", str(pairs), "--out",
                                  str(tmp_path / "head"), "--pair-roles", "query-document", "--epochs", "1",
                                  "--hidden", "8", "--batch-size", "5", "--mined-k", "0"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["index", "--store", str(tmp_path / "s"), "--head", str(tmp_path / "head"), "--data",
                                  str(pairs), "--out", str(tmp_path / "index"), "--pair-roles", "query-document"])
    assert r.exit_code == 0, r.output  # the corpus is the document role: positives, not the query anchors
    assert sorted(pl.read_parquet(tmp_path / "index" / "items.parquet")["text"]) == sorted(
        [f"cat tree {i}" for i in range(11)] + ["red river"])


def test_pipeline_search_and_export_take_the_roles(world, tmp_path):
    from sentence_transformers import SentenceTransformer

    from headstore.heads.apply.export import export_head
    from headstore.heads.apply.pipeline import Pipeline
    from headstore.heads.artefacts.head import Head

    featurize(FeaturizeConfig(model=str(world["st_excl"]), dtype="float32"), [world["beir"]], tmp_path / "s")
    r = CliRunner().invoke(main, ["train-head", "--store", str(tmp_path / "s"), "--data", str(world["beir"]), "--out",
                                  str(tmp_path / "head"), "--epochs", "1", "--hidden", "8", "--batch-size", "4",
                                  "--mined-k", "2", "--no-guard"])
    assert r.exit_code == 0, r.output
    head = Head.load(str(tmp_path / "head"))
    store = FeatureStore.open(tmp_path / "s")
    pipe = Pipeline.from_head(head, str(world["st_excl"]))
    for role in ("query", "document"):
        stored = head.embed(store.features(store.rows_for(store.row_ids([SHARED], role))))
        assert np.abs(pipe.encode([SHARED], role=role) - stored).max() <= 1e-5
    assert np.abs(pipe.encode([SHARED], role="query") - pipe.encode([SHARED])).max() > 1e-3  # roles differ
    export_head(str(tmp_path / "head"), "sentence-transformers", tmp_path / "st-out", str(world["st_excl"]))
    exported = SentenceTransformer(str(tmp_path / "st-out"), device="cpu")
    for role in ("query", "document"):
        got = exported.encode([SHARED], prompt_name=role, convert_to_numpy=True)
        assert np.abs(got - pipe.encode([SHARED], role=role)).max() <= 1e-5
    r = CliRunner().invoke(main, ["index", "--store", str(tmp_path / "s"), "--head", str(tmp_path / "head"),
                                  "--data", str(world["beir"]), "--out", str(tmp_path / "index")])
    assert r.exit_code == 0, r.output
    from headstore.heads.apply.search import SearchIndex

    index = SearchIndex(tmp_path / "index")
    hits = index.search([SHARED], k=3, model=str(world["st_excl"]))[0]
    expected = index.search_vectors(pipe.encode([SHARED], role="query"), k=3)[0][0]
    assert [h["id"] for h in hits] == [index.items["id"][int(p)] for p in expected]
