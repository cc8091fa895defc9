"""Query-side heads (issue 20, lever 3: `--sides query`): documents keep their normalised stored features, only
queries pass through the head, E(q, d) = ||f(q) - n(d)||. Checked against the features themselves (bit for
bit), losses and energies computed by hand, sentence-transformers' own encode_query / encode_document, and a
FAISS index built for another head."""
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import headstore
from headstore.cli import main
from headstore.heads.training.batches import batch_losses, make_batch, prepare_data
from headstore.heads.training.resolved import resolve_stack
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.evaluation.evaluate import embed_rows
from headstore.heads.scoring.losses import get_loss
from headstore.heads.network.model import StackedMLP
from headstore.heads.training.strength import with_strength
from headstore.heads.training.train import train_one

from .synthetic import planted_ir_task

QUERY_SIDE = HeadConfig(in_dim=16, hidden=12, sides="query")


def _train(world, out, *extra):
    r = CliRunner().invoke(main, ["train-head", "--store", str(world.store), "--data", str(world.beir), "--out",
                                  str(out), "--hidden", "16", "--epochs", "2", "--batch-size", "8", "--mined-k", "2",
                                  "--no-guard", "--no-lexical", *extra])  # the dense index's space (BM25: test_lexical)
    assert r.exit_code == 0, r.output
    return headstore.Head.load(out)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    task, X = planted_ir_task(n_docs=120)
    cfg = TrainConfig(epochs=3, batch_size=16, mined_k=2, guard=False)
    model, norm, run = train_one(task, X, QUERY_SIDE, cfg, progress=False)
    return task, X, model, norm


def test_a_query_side_head_moves_queries_and_leaves_documents_bit_for_bit(trained):
    task, X, model, norm = trained
    Xn = norm(X)
    docs = task.eval_sets["test"].doc_rows
    queries = task.eval_sets["test"].query_rows
    assert torch.equal(embed_rows(model, Xn, docs, "document")[0], Xn[torch.as_tensor(docs)])
    assert not torch.allclose(embed_rows(model, Xn, queries, "query")[0], Xn[torch.as_tensor(queries)])
    both = StackedMLP(1, HeadConfig(**{**QUERY_SIDE.__dict__, "sides": "both"}), seeds=[0])
    both.load_state_dict(model.state_dict())  # the same weights, both sides: documents move too
    assert not torch.equal(embed_rows(both, Xn, docs, "document")[0], Xn[torch.as_tensor(docs)])


def test_training_passes_only_the_queries_through_the_head(trained):
    task, X, _, _ = trained
    cfg = TrainConfig(batch_size=8, mined_k=0)
    data = prepare_data(task, X, cfg.loss, cfg.normalize)
    model = StackedMLP(2, QUERY_SIDE, seeds=[3, 4])
    with torch.no_grad():  # away from the identity start, so f(q) != q
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    idx = torch.stack([torch.arange(8), torch.arange(8, 16)])  # (H, b)
    batch = make_batch(data, idx, None)
    got = batch_losses(model, data.X, batch, resolve_stack([cfg]), form=data.pairs.form)
    za = model(data.X[batch.anchor])  # (H, b, d): each head on its own queries
    zp = data.X[batch.positive]  # (H, b, d): the documents' normalised features, no head
    want = get_loss(cfg.loss, data.pairs.form)(za, zp, None, None, energy=cfg.energy, cfg=cfg.loss_config(),
                                               same=batch.same)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_train_head_query_side_scores_and_runs_are_its_energy(world, tmp_path):
    head = _train(world, tmp_path / "qs", "--sides", "query", "--lr", "1e-2")
    assert head.query_side and head.head_config.sides == "query"
    store = headstore.Store.open(world.store)
    # run.test.trec: each line's score is -||f(q) - n(d)||_1 computed here from the stored features
    lines = (tmp_path / "qs" / "run.test.trec").read_text().split()
    queries = {q["_id"]: q["text"] for q in map(json.loads, (world.beir / "queries.jsonl").read_text().splitlines())}
    docs = {d["_id"]: (d.get("title", "") + " " + d["text"]).strip()
            for d in map(json.loads, (world.beir / "corpus.jsonl").read_text().splitlines())}
    for qid, _, did, _, score, _ in list(zip(*[iter(lines)] * 6))[:40]:
        fq = head.embed(store.features(store.rows_for([queries[qid]], role="query")), "query")[0]
        nd = head.normalizer(torch.as_tensor(store.features(store.rows_for([docs[did]], role="document"))))[0]
        assert float(score) == pytest.approx(-np.abs(fq - nd.numpy()).sum(), rel=1e-6, abs=1e-6)
    with pytest.raises(ValueError, match="give role='query' or role='document'"):
        head.embed(store.features([0]))


def test_strength_zero_gives_the_frozen_features_on_both_sides(trained):
    task, X, model, norm = trained
    x = norm(X[:30])
    zero = with_strength(model, [0.0])
    assert torch.equal(zero.encode(x, "query")[0], x) and torch.equal(zero.encode(x, "document")[0], x)


def test_export_routes_queries_through_the_head_and_documents_around_it(world, tmp_path):
    from sentence_transformers import SentenceTransformer

    head = _train(world, tmp_path / "qs", "--sides", "query", "--lr", "1e-2")
    r = CliRunner().invoke(main, ["export", "--head", str(tmp_path / "qs"), "--format", "sentence-transformers",
                                  "--out", str(tmp_path / "st")])
    assert r.exit_code == 0, r.output
    texts = headstore.Store.open(world.store).texts["text"].to_list()[:20]
    st = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    pipe = headstore.Pipeline.from_head(head)
    q, d = pipe.encode(texts, role="query"), pipe.encode(texts, role="document")
    np.testing.assert_allclose(st.encode_query(texts, convert_to_numpy=True), q, rtol=0, atol=1e-5)
    np.testing.assert_allclose(st.encode_document(texts, convert_to_numpy=True), d, rtol=0, atol=1e-5)
    np.testing.assert_allclose(st.encode(texts, convert_to_numpy=True), d, rtol=0, atol=1e-5)  # the default route
    features = pipe.features(texts, role="document")
    assert np.array_equal(d, head.normalizer(torch.as_tensor(features)).numpy())  # documents: no head at all
    assert not np.allclose(q, d, atol=1e-4)
    summary = json.loads((tmp_path / "st" / "headstore_export.json").read_text())
    assert summary["modules"] == ["Router"] and "Dense" not in summary["routes"]["document"]


def test_one_corpus_index_serves_every_query_side_head(world, tmp_path):
    import faiss

    a = _train(world, tmp_path / "a", "--sides", "query", "--lr", "1e-2", "--seed", "1")
    _train(world, tmp_path / "b", "--sides", "query", "--lr", "3e-3", "--seed", "2")
    _train(world, tmp_path / "both", "--lr", "1e-2")
    r = CliRunner().invoke(main, ["index", "--store", str(world.store), "--head", str(tmp_path / "a"), "--data",
                                  str(world.beir), "--out", str(tmp_path / "idx-a")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["index", "--store", str(world.store), "--head", str(tmp_path / "b"), "--data",
                                  str(world.beir), "--out", str(tmp_path / "idx-b")])
    assert r.exit_code == 0, r.output
    index = faiss.read_index(str(tmp_path / "idx-a" / "index.faiss"))
    vectors = index.reconstruct_n(0, index.ntotal)
    store = headstore.Store.open(world.store)
    rows = __import__("polars").read_parquet(tmp_path / "idx-a" / "items.parquet")["row"].to_numpy()
    assert np.array_equal(vectors, a.normalizer(torch.as_tensor(store.features(rows))).numpy())  # bit for bit
    queries = ["alpha beta", "gamma delta river"]
    search = lambda idx, *head: CliRunner().invoke(main, [  # noqa: E731
        "search", "--index", str(tmp_path / idx), *[x for h in head for x in ("--head", str(tmp_path / h))],
        *[x for q in queries for x in ("--query", q)], "--out", str(tmp_path / f"{idx}-{'-'.join(head)}.json")])
    assert search("idx-b").exit_code == 0 and search("idx-a", "b").exit_code == 0
    assert (json.loads((tmp_path / "idx-a-b.json").read_text()) == json.loads((tmp_path / "idx-b-.json").read_text()))
    refused = search("idx-a", "both")
    assert refused.exit_code != 0 and "only query-side heads" in refused.output and "Traceback" not in refused.output


def test_bad_query_side_settings_are_refused(world, tmp_path):
    with pytest.raises(ValueError, match="out_dim == in_dim"):
        StackedMLP(1, HeadConfig(in_dim=16, out_dim=8, residual=False, sides="query"))
    with pytest.raises(ValueError, match="one stored array"):
        StackedMLP(1, HeadConfig(in_dim=16, mix=2, sides="query"))
    with pytest.raises(ValueError, match="valid: \\['both', 'query'\\]"):
        HeadConfig(sides="documents")
    r = CliRunner().invoke(main, ["train-head", "--store", str(world.store), "--data", str(world.beir), "--out",
                                  str(tmp_path / "x"), "--sides", "both-ways"])
    assert r.exit_code != 0 and "both-ways" in r.output


def test_a_grid_sweeps_sides_and_heads_of_both_sides_keep_their_ids(world, tmp_path):
    import polars as pl

    def grid(name, text):
        spec = tmp_path / f"{name}.toml"
        spec.write_text(text)
        r = CliRunner().invoke(main, ["grid", "--store", str(world.store), "--data", str(world.beir), "--grid",
                                      str(spec), "--out", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        return pl.read_parquet(tmp_path / name / "results.parquet")

    fixed = "[fixed]\nepochs = 1\nbatch_size = 8\nhidden = 16\nmined_k = 2\n"
    swept = grid("swept", '[grid]\nsides = ["both", "query"]\nseed = [0]\n' + fixed)
    plain = grid("plain", "[grid]\nseed = [0]\n" + fixed)
    both = swept.filter(pl.col("sides").is_null() | (pl.col("sides") == "both"))
    assert len(swept) == 2 and both["head_id"].to_list() == plain["head_id"].to_list()
    query = headstore.Head.load(f"{tmp_path / 'swept'}#id={swept.filter(pl.col('sides') == 'query')['head_id'][0]}")
    assert query.query_side


def test_labelled_texts_have_no_sides_to_train_a_query_side_head_on(tmp_path):
    from headstore.heads.kinds import for_training, load_task

    from .label_world import planted_labels

    (tmp_path / "labels").mkdir()
    path, store, X = planted_labels(tmp_path / "labels", n=120)
    cfg = TrainConfig(loss="supcon-kl", epochs=1, batch_size=16)
    task = for_training(load_task(str(path), store, "labels?label_sep=."), cfg)
    with pytest.raises(ValueError, match="labelled texts have no such sides"):
        train_one(task, X, HeadConfig(in_dim=16, depth=1, sides="query"), cfg, progress=False)
