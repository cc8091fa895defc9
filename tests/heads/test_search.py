"""cli index / search: the flat FAISS index returns headstore's exact top-10 (L1 and cosine heads);
HNSW returns true energies; queries typed as text go through the Pipeline."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

import headstore
from headstore.cli import main
from headstore.heads.scoring.energy import pairwise_energy
from headstore.heads.scoring.ir_metrics import topk_ranking
from headstore.heads.settings.config import HeadConfig
from headstore.heads.apply.search import SearchIndex, build_index, corpus_items, recall_at_k


def _queries(world) -> list[str]:
    return [json.loads(line)["text"] for line in (world.beir / "queries.jsonl").read_text().splitlines()]


def _exact(world, head, queries, k=10):
    """headstore's exact ranking of the corpus for stored query texts: (doc ids (Q, k), energies (Q, k))."""
    store = headstore.Store.open(world.store)
    items = corpus_items(str(world.beir))
    zq = head.embed_tensor(store.features(store.rows_for(queries)))
    zd = head.embed_tensor(store.features(store.rows_for(items["text"].to_list())))
    idx, val = topk_ranking(pairwise_energy(head.energy_name, zq, zd), k=k, return_energies=True)
    return np.asarray(items["id"].to_list())[idx.numpy()], val.numpy(), zq.numpy()


@pytest.mark.parametrize("kind", ["l1", "cosine"])
def test_flat_index_top10_equals_the_exact_ranking(world, tmp_path, kind):
    head_dir = world.head if kind == "l1" else world.random_head("cos", HeadConfig(hidden=16), loss="mnr")
    out = tmp_path / "idx"
    r = CliRunner().invoke(main, ["index", "--store", str(world.store), "--head", str(head_dir), "--data",
                                  str(world.beir), "--out", str(out)])
    assert r.exit_code == 0, r.output
    index, head = SearchIndex(out), headstore.Head.load(head_dir)
    assert index.info["energy"] == kind and index.info["kind"] == "flat"
    queries = _queries(world)
    ids, energies, zq = _exact(world, head, queries)
    pos, got = index.search_vectors(zq, k=10)
    np.testing.assert_array_equal(np.asarray(index.items["id"].to_list())[pos], ids)
    np.testing.assert_allclose(got, energies, rtol=1e-4, atol=1e-5)
    typed = index.search(queries[:5], k=10)  # texts -> Pipeline -> index
    assert [[h["id"] for h in hits] for hits in typed] == ids[:5].tolist()


def test_hnsw_index_returns_true_energies(world, tmp_path):
    info = build_index(str(world.store), str(world.head), str(world.beir), str(tmp_path / "hnsw"), hnsw=8,
                       progress=False)
    assert info["kind"] == "hnsw" and info["metric"] == "METRIC_L1"
    index, head = SearchIndex(tmp_path / "hnsw"), headstore.Head.load(world.head)
    _, _, zq = _exact(world, head, _queries(world))
    pos, got = index.search_vectors(zq, k=10)
    assert (np.diff(got, axis=1) >= 0).all()
    store = headstore.Store.open(world.store)
    zd = head.embed(store.features(index.items["row"].to_numpy()))
    for q in range(len(zq)):  # every returned energy is the true energy of that item
        true = np.abs(zd[pos[q]] - zq[q]).sum(1)
        np.testing.assert_allclose(got[q], true, rtol=1e-4, atol=1e-5)
    assert recall_at_k(np.array([[1, 2, 3], [4, 5, 6]]), np.array([[3, 9, 1], [7, 8, 0]])) == pytest.approx(1 / 3)


def test_cli_search_prints_a_table_and_writes_json(world, tmp_path):
    build_index(str(world.store), str(world.head), str(world.beir), str(tmp_path / "idx"), progress=False)
    qfile = tmp_path / "q.txt"
    qfile.write_text("alpha beta river\n\nsigma omega stone\n")
    r = CliRunner().invoke(main, ["search", "--index", str(tmp_path / "idx"), "--queries", str(qfile), "--query",
                                  "gamma delta", "--k", "3", "--out", str(tmp_path / "hits.json")])
    assert r.exit_code == 0, r.output
    assert r.output.count("query: ") == 3 and "energy" in r.output
    hits = json.loads((tmp_path / "hits.json").read_text())
    assert [h["query"] for h in hits] == ["gamma delta", "alpha beta river", "sigma omega stone"]
    assert all(len(h["hits"]) == 3 and [x["rank"] for x in h["hits"]] == [1, 2, 3] for h in hits)


def test_index_refuses_a_head_from_another_store(world, tmp_path):
    head = headstore.Head.load(world.head)
    head.config = {**head.config, "store_fingerprint": "0" * 64}
    head.save(tmp_path / "alien")
    r = CliRunner().invoke(main, ["index", "--store", str(world.store), "--head", str(tmp_path / "alien"), "--data",
                                  str(world.beir), "--out", str(tmp_path / "idx")])
    assert r.exit_code != 0 and "fingerprint" in r.output and not (tmp_path / "idx").exists()
    r = CliRunner().invoke(main, ["search", "--index", str(tmp_path / "nowhere"), "--query", "x"])
    assert r.exit_code != 0 and "cli index" in r.output
