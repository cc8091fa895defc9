"""The document memory (docs/memory.md) on a tiny model: what it edits and leaves, where it is used (eval, index,
Pipeline, export), and its bad inputs."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from headstore.data.text_id import doc_text, text_id
from headstore.featurize.store.api import Store
from headstore.heads.artefacts.head import Head
from headstore.heads.artefacts.memory import MEMORY_FILE, DocumentMemory, judgements_digest
from headstore.heads.scoring.energy import pairwise_energy

from .conftest import assert_bad_input, cli
from .finetune_world import tiny_sts
from .memory_world import N_JUDGED, MemoryWorld, seen_beir


@pytest.fixture(scope="module")
def mw(tmp_path_factory) -> MemoryWorld:
    return MemoryWorld(tmp_path_factory.mktemp("memory-world"))


def _corpus(mw):
    rows = [json.loads(line) for line in (mw.beir / "corpus.jsonl").read_text().splitlines()]
    return [r["_id"] for r in rows], [doc_text(r["title"], r["text"]) for r in rows]


def _queries(mw):
    return {r["_id"]: r["text"] for r in map(json.loads, (mw.beir / "queries.jsonl").read_text().splitlines())}


def test_memory_moves_a_judged_document_to_rank_1_and_leaves_the_others_bit_for_bit(mw):
    head, store = Head.load(mw.head), Store.open(mw.store)
    assert head.memory is not None and head.memory.gamma > 0
    ids, texts = _corpus(mw)
    X = store.features(store.rows_for(texts))
    plain = head.embed(X, "document")
    edited = head.embed(X, "document", [text_id(t) for t in texts])
    judged = np.array([i < N_JUDGED for i in range(len(ids))])  # d0 .. d11 are the training judgements' documents
    assert np.array_equal(edited[~judged], plain[~judged])  # unjudged: bit for bit
    assert not np.allclose(edited[judged], plain[judged])
    queries = _queries(mw)
    q = head.embed(store.features(store.rows_for([queries[f"t{i}"] for i in range(N_JUDGED)])), "query")
    for with_memory, expect in ((edited, True), (plain, False)):
        energies = pairwise_energy(head.energy_name, torch.as_tensor(q), torch.as_tensor(with_memory)).numpy()
        first = energies.argmin(1) == np.arange(N_JUDGED)  # each training query's own document ranks first
        assert first.all() if expect else not first.all()


def test_memory_file_is_keyed_by_the_store_and_the_judgements_and_no_larger_than_judged_x_width(mw):
    memory = DocumentMemory.load(mw.head / MEMORY_FILE)
    store = Store.open(mw.store)
    ids, texts = _corpus(mw)
    queries = _queries(mw)
    assert memory.store_fingerprint == store.fingerprint
    # refitted on the training and dev judgements once dev chose the strength (the dev queries v_i judge d_i too)
    assert memory.judgements == judgements_digest([(text_id(queries[f"{s}{i}"]), text_id(texts[i]))
                                                  for i in range(N_JUDGED) for s in ("t", "v")])
    assert mw.metrics["memory"]["fit"]["judgements"] == "train+dev" and "dev" not in mw.metrics["memory"]
    assert memory.vectors.shape == (N_JUDGED, Head.load(mw.head).out_dim) and set(memory.doc_ids) == set(ids[:N_JUDGED])
    assert mw.metrics["memory"]["fit"]["fit_seconds"] < 60


def test_eval_applies_the_memory_and_no_memory_turns_it_off(mw, tmp_path):
    r = cli("eval", "--store", mw.store, "--head", mw.head, "--data", mw.beir, "--out", tmp_path / "on")
    assert r.exit_code == 0, r.output
    on = json.loads((tmp_path / "on" / "metrics.json").read_text())
    assert on["memory"]["test"]["head+memory"] == pytest.approx(mw.metrics["memory"]["test"]["head+memory"])
    assert on["memory"]["test"]["parts"]["counts"] == {"seen": N_JUDGED, "unseen": 4, "all": N_JUDGED + 4}
    assert "memory: " in r.output
    r = cli("eval", "--store", mw.store, "--head", mw.head, "--data", mw.beir, "--out", tmp_path / "off", "--no-memory")
    assert r.exit_code == 0, r.output
    assert "memory" not in json.loads((tmp_path / "off" / "metrics.json").read_text())


def test_index_holds_the_edited_vectors_and_the_pipeline_knows_documents_by_text(mw, tmp_path):
    pytest.importorskip("faiss")
    r = cli("index", "--store", mw.store, "--head", mw.head, "--data", mw.beir, "--out", tmp_path / "idx")
    assert r.exit_code == 0, r.output
    import faiss
    index = faiss.read_index(str(tmp_path / "idx" / "index.faiss"))
    stored = index.reconstruct_n(0, index.ntotal)
    head, store = Head.load(mw.head), Store.open(mw.store)
    _, texts = _corpus(mw)
    edited = head.embed(store.features(store.rows_for(texts)), "document", [text_id(t) for t in texts])
    np.testing.assert_array_equal(stored, edited)
    from headstore.heads.apply.pipeline import Pipeline
    pipe = Pipeline.from_head(head, str(mw.model))
    out = pipe.encode(texts[:2], role="document")
    np.testing.assert_allclose(out, edited[:2], atol=1e-5)
    with pytest.raises(ValueError, match="document the head's memory edited; say role="):
        pipe.encode(texts[:1])


def test_export_says_the_memory_cannot_ride_in_the_model_and_writes_it_beside(mw, tmp_path):
    r = cli("export", "--head", mw.head, "--format", "sentence-transformers", "--out", tmp_path / "st",
            "--model", mw.model)
    assert r.exit_code == 0, r.output
    assert "cannot carry per-document vectors" in r.output
    beside = DocumentMemory.load(tmp_path / "st" / MEMORY_FILE)
    assert torch.equal(beside.vectors, Head.load(mw.head).memory.vectors)


def test_memory_asked_for_on_a_dataset_without_judgements_is_one_line(mw, tmp_path):
    sts = tiny_sts(tmp_path / "sts.parquet")
    store = tmp_path / "store"
    shutil.copytree(mw.store, store)
    assert cli("featurize", "--model", mw.model, "--data", sts, "--store", store, "--dtype", "float32").exit_code == 0
    r = cli("train-head", "--store", store, "--data", sts, "--out", tmp_path / "h", "--memory", "--epochs", "1")
    assert_bad_input(r, "--memory", "no training judgements")
    assert not (tmp_path / "h").exists()


def test_memory_of_another_store_and_a_changed_document_are_one_line(mw, tmp_path):
    head = tmp_path / "head"
    shutil.copytree(mw.head, head)
    memory = DocumentMemory.load(head / MEMORY_FILE)
    DocumentMemory(**{**memory.__dict__, "store_fingerprint": "0" * 64}).save(head / MEMORY_FILE)
    r = cli("eval", "--store", mw.store, "--head", head, "--data", mw.beir, "--out", tmp_path / "e1")
    assert_bad_input(r, "fingerprint", "--no-memory")
    assert not (tmp_path / "e1").exists()
    (head / MEMORY_FILE).write_bytes((head / MEMORY_FILE).read_bytes()[:100])  # truncated: one line; --no-memory
    assert_bad_input(cli("eval", "--store", mw.store, "--head", head, "--data", mw.beir, "--out", tmp_path / "e1"),
                     "not a document memory")  # ... leaves it unread
    assert cli("eval", "--store", mw.store, "--head", head, "--data", mw.beir, "--out", tmp_path / "e1",
               "--no-memory").exit_code == 0
    changed = tmp_path / "other" / mw.beir.name  # the same dataset, document d0 edited since
    shutil.copytree(mw.beir, changed)
    rows = [json.loads(line) for line in (changed / "corpus.jsonl").read_text().splitlines()]
    rows[0]["text"] += " edited"
    (changed / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = tmp_path / "store"
    shutil.copytree(mw.store, store)
    assert cli("featurize", "--model", mw.model, "--data", changed, "--store", store, "--dtype", "float32").exit_code == 0
    r = cli("eval", "--store", store, "--head", mw.head, "--data", changed, "--out", tmp_path / "e2")
    assert_bad_input(r, "'d0'", "text changed")
    assert not (tmp_path / "e2").exists()


def test_a_training_query_that_is_a_judged_document_and_an_all_seen_test_are_said(mw, tmp_path):
    bad = seen_beir(tmp_path / "bad" / "seen", query_is_doc=True)
    allseen = seen_beir(tmp_path / "allseen" / "seen", n_unseen=0)
    store = tmp_path / "store"
    shutil.copytree(mw.store, store)
    for data in (bad, allseen):
        assert cli("featurize", "--model", mw.model, "--data", data, "--store", store, "--dtype", "float32").exit_code == 0
    fast = ("--epochs", "1", "--hidden", "16", "--batch-size", "4", "--mined-k", "2")
    r = cli("train-head", "--store", store, "--data", bad, "--out", tmp_path / "h1", *fast)
    assert_bad_input(r, "also a judged corpus document", "--no-memory")
    assert not (tmp_path / "h1").exists()
    r = cli("train-head", "--store", store, "--data", allseen, "--out", tmp_path / "h2", *fast)
    assert r.exit_code == 0, r.output
    assert "every test query is seen" in r.output


def test_a_memory_before_the_head_edits_its_inputs_and_after_it_its_outputs_documents_only():
    from headstore.heads.artefacts.memory import PlacedMemory
    from headstore.heads.evaluation.evaluate import embed_rows
    from headstore.heads.network.model import HeadConfig, StackedMLP

    model = StackedMLP(1, HeadConfig(in_dim=8, hidden=8, depth=2, residual=False), seeds=[0]).eval()
    X = torch.randn(10, 8, generator=torch.Generator().manual_seed(0))
    V = torch.randn(2, 8, generator=torch.Generator().manual_seed(1))
    rows = np.array([7, 1, 3])
    edited = X.clone()
    edited[[3, 7]] = V
    before = PlacedMemory(np.array([3, 7]), V, "features")
    with torch.no_grad():
        expect = model.encode(edited[rows], "document")
        plain = model.encode(X[rows], "query")
    assert torch.equal(embed_rows(model, X, rows, "document", memory=before), expect)
    assert torch.equal(embed_rows(model, X, rows, "query", memory=before), plain)  # a query is never edited
    after = embed_rows(model, X, rows, "document", memory=PlacedMemory(np.array([3, 7]), V, "outputs"))
    assert torch.equal(after[0, [0, 2]], V[[1, 0]]) and torch.equal(after[0, 1], plain[0, 1])
