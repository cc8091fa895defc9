"""train-head and eval write TREC run files; pytrec_eval (trec_eval) on them reproduces metrics.json."""
import json

import pytest
from click.testing import CliRunner

from headstore.cli import main
from headstore.data.readers import read_beir

pytrec_eval = pytest.importorskip("pytrec_eval")


def _run(path, depth=None) -> dict:
    run: dict = {}
    for line in path.read_text().splitlines():
        qid, q0, doc, rank, score, name = line.split()
        if depth is None or int(rank) <= depth:
            run.setdefault(qid, {})[doc] = float(score)
    return run


def _qrels(beir, split) -> dict:
    frame = read_beir(beir).qrels[split]
    qrels: dict = {}
    for q, d, s in frame.select("query_id", "corpus_id", "score").iter_rows():
        qrels.setdefault(str(q), {})[str(d)] = int(s)
    return qrels


def _trec_means(run: dict, qrels: dict, measures: set) -> dict:
    per_query = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    names = next(iter(per_query.values())).keys()
    return {m: sum(q[m] for q in per_query.values()) / len(per_query) for m in names}


def _check(run_file, qrels, metrics, prefix):
    lines = run_file.read_text().splitlines()
    assert lines and all(len(line.split()) == 6 and line.split()[1] == "Q0" for line in lines)
    full = _trec_means(_run(run_file), qrels, {"ndcg_cut.10", "recall.100", "map_cut.100"})
    assert full["ndcg_cut_10"] == pytest.approx(metrics[f"{prefix}_ndcg@10"], abs=1e-6)
    assert full["recall_100"] == pytest.approx(metrics[f"{prefix}_recall@100"], abs=1e-6)
    assert full["map_cut_100"] == pytest.approx(metrics[f"{prefix}_map@100"], abs=1e-6)
    top10 = _trec_means(_run(run_file, depth=10), qrels, {"recip_rank"})
    assert top10["recip_rank"] == pytest.approx(metrics[f"{prefix}_mrr@10"], abs=1e-6)


def test_train_head_and_eval_run_files_reproduce_metrics(world, tmp_path):
    metrics = json.loads((world.head / "metrics.json").read_text())
    _check(world.head / "run.test.trec", _qrels(world.beir, "test"), metrics["head"], "manhattan")
    # dev = train queries held out (no dev qrels file): pytrec_eval scores the queries the run holds
    _check(world.head / "run.dev.trec", _qrels(world.beir, "train"), metrics["dev"]["head"], "manhattan")
    r = CliRunner().invoke(main, ["eval", "--store", str(world.store), "--head", str(world.head), "--data",
                                  str(world.beir), "--out", str(tmp_path / "eval")])
    assert r.exit_code == 0, r.output
    again = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    _check(tmp_path / "eval" / "run.test.trec", _qrels(world.beir, "test"), again["head"], "manhattan")


def test_terminal_shows_a_short_table_not_the_json(world, tmp_path):
    r = CliRunner().invoke(main, ["eval", "--store", str(world.store), "--head", str(world.head), "--data",
                                  str(world.beir), "--out", str(tmp_path / "eval")])
    assert r.exit_code == 0, r.output
    assert "baseline cosine_ndcg@10" in r.output and "head manhattan_ndcg@10" in r.output and "95% CI" in r.output
    assert "{" not in r.output and "metrics.json" in r.output
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert f"{metrics['head']['manhattan_ndcg@10']:.4f}" in r.output
