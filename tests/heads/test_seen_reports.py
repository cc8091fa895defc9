"""Seen / unseen in the IR reports on a tiny model: train-head's and eval's metrics.json "parts" against a
hand-made qrels (counts) and trec_eval's scores of the run file on each part (values), a transfer dataset all
unseen, every query seen said in one line, and the paired interval against scipy's bootstrap."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import pytrec_eval
from scipy import stats

from headstore.heads.kinds.seen import seen_parts

from .conftest import FAST, cli
from .finetune_world import sentence, tiny_beir, tiny_bert

# relevant d0..d4: judged in training (q0..q19 -> d0..d19); q35's d35: judged by dev (q33), which selection saw
SEEN_TEST = [*(f"q{i}" for i in range(20, 25)), "q35"]
UNSEEN_TEST = [f"q{i}" for i in range(25, 31)]  # d25..d30, and q30's judged d5 graded 0 (not relevant)
# dev is set against the train pairs only: q31, q32 on d1, d2 seen; q33, q34 on d35, d36 unseen


def _beir(folder, seed=0):
    """40 documents; train q0..q19 -> d0..d19; test and dev partly on trained documents (the lists above)."""
    rng = random.Random(seed)
    (folder / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": sentence(rng, 2), "text": sentence(rng, 8) + f" {i}"} for i in range(40)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    queries = [{"_id": f"q{i}", "text": sentence(rng, 4) + f" {i}"} for i in range(36)]
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    head = "query-id\tcorpus-id\tscore\n"
    qrels = {"train": [(f"q{i}", f"d{i}", 1) for i in range(20)],
             "test": [(f"q{20 + i}", f"d{i}", 1) for i in range(5)] + [(f"q{i}", f"d{i}", 1) for i in range(25, 30)]
             + [("q30", "d5", 0), ("q30", "d30", 1), ("q35", "d35", 1)],
             "dev": [("q31", "d1", 1), ("q32", "d2", 2), ("q33", "d35", 1), ("q34", "d36", 1)]}
    for split, rows in qrels.items():
        (folder / "qrels" / f"{split}.tsv").write_text(head + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in rows))
    return folder


@pytest.fixture(scope="module")
def seen_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("seen")
    w = {"root": root, "model": tiny_bert(root / "model", layers=2), "beir": _beir(root / "beir"),
         "other": tiny_beir(root / "other", seed=9, n_docs=20, n_train=0, n_test=8), "store": root / "store"}
    r = cli("featurize", "--model", w["model"], "--data", w["beir"], "--data", w["other"], "--store", w["store"],
            "--dtype", "float32")
    assert r.exit_code == 0, r.output
    w["head"] = root / "head"
    r = cli("train-head", "--store", w["store"], "--data", w["beir"], "--out", w["head"], *FAST)
    assert r.exit_code == 0, r.output
    w["output"] = r.output
    return w


def _trec_eval_mean(run_file, qrels_file, queries) -> float:
    """Mean nDCG@10 of `queries` by pytrec_eval on the run file and the qrels (an independent scorer)."""
    run, qrels = {}, {}
    for line in run_file.read_text().splitlines():
        q, _, d, _, score, _ = line.split()
        run.setdefault(q, {})[d] = float(score)
    for line in qrels_file.read_text().splitlines()[1:]:
        q, d, s = line.split("\t")
        qrels.setdefault(q, {})[d] = int(s)
    scores = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    return float(np.mean([scores[q]["ndcg_cut_10"] for q in queries]))


def test_train_head_parts_match_the_hand_made_qrels(seen_world):
    w = seen_world
    m = json.loads((w["head"] / "metrics.json").read_text())
    parts, dev = m["parts"], m["dev"]["parts"]
    assert [parts[p]["n"] for p in ("seen", "unseen", "all")] == [len(SEEN_TEST), len(UNSEEN_TEST), 12]
    assert [dev[p]["n"] for p in ("seen", "unseen", "all")] == [2, 2, 4]
    assert parts["all"]["head"] == pytest.approx(m["head"][m["primary"]], abs=1e-9)
    assert parts["all"]["baseline"] == pytest.approx(m["baseline"][m["baseline_primary"]], abs=1e-9)
    qrels = w["beir"] / "qrels" / "test.tsv"
    for part, queries in (("seen", SEEN_TEST), ("unseen", UNSEEN_TEST)):
        assert parts[part]["head"] == pytest.approx(_trec_eval_mean(w["head"] / "run.test.trec", qrels, queries),
                                                    abs=1e-6)
        assert parts[part]["delta"] == pytest.approx(parts[part]["head"] - parts[part]["baseline"])
        lo, hi = parts[part]["ci"]["delta"]
        assert lo <= parts[part]["delta"] <= hi
    assert "seen / unseen" in w["output"] and "unseen " in w["output"]  # the terminal's short table
    judged = json.loads((w["head"] / "config.json").read_text())["judged"]
    assert judged == {"file": "judgements.parquet", "pairs": {"train": 20, "dev": 4}, "documents": 22}


def test_eval_on_the_same_dataset_splits_as_train_head(seen_world):
    w = seen_world
    out = w["root"] / "eval-same"
    r = cli("eval", "--store", w["store"], "--head", w["head"], "--data", w["beir"], "--out", out)
    assert r.exit_code == 0, r.output
    trained = json.loads((w["head"] / "metrics.json").read_text())["parts"]
    parts = json.loads((out / "metrics.json").read_text())["parts"]
    assert {p: parts[p]["n"] for p in parts if p != "note"} == {"seen": 6, "unseen": 6, "all": 12}
    assert parts["seen"]["head"] == pytest.approx(trained["seen"]["head"], abs=1e-6)


def test_eval_on_another_dataset_is_all_unseen(seen_world):
    w = seen_world
    out = w["root"] / "eval-other"
    r = cli("eval", "--store", w["store"], "--head", w["head"], "--data", w["other"], "--out", out)
    assert r.exit_code == 0, r.output
    parts = json.loads((out / "metrics.json").read_text())["parts"]
    assert parts["seen"] == {"n": 0} and parts["unseen"]["n"] == parts["all"]["n"] == 8
    assert parts["note"].startswith("all unseen")
    assert "all unseen" in r.output


def test_every_query_seen_is_one_warning_line(seen_world, tmp_path):
    """Training judgements covering every test document: a warning, not a failure."""
    w = seen_world
    data = tmp_path / "all-seen"
    _beir(data)
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"q{20 + i}\td{i}\t1\n" for i in range(5)))
    out = tmp_path / "out"
    r = cli("eval", "--store", w["store"], "--head", w["head"], "--data", data, "--out", out)
    assert r.exit_code == 0, r.output
    m = json.loads((out / "metrics.json").read_text())
    assert m["parts"]["unseen"] == {"n": 0} and m["parts"]["seen"]["n"] == 5
    warning = [line for line in r.output.splitlines()
               if line.startswith("WARNING") and "every test query is seen" in line]
    assert len(warning) == 1, r.output


def test_a_head_without_its_record_says_so(seen_world, tmp_path):
    import shutil

    w = seen_world
    head = tmp_path / "old-head"
    shutil.copytree(w["head"], head)
    (head / "judgements.parquet").unlink()
    config = json.loads((head / "config.json").read_text())
    config.pop("judged")
    (head / "config.json").write_text(json.dumps(config))
    r = cli("eval", "--store", w["store"], "--head", head, "--data", w["beir"], "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert "parts" not in m and "keeps no training judgements" in m["parts_note"]


def test_paired_interval_matches_scipy_bootstrap():
    """The delta's interval is paired: it matches scipy.stats.bootstrap of the paired mean difference and is far
    narrower than an unpaired one where head and frozen move together across queries."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 1, 300)
    head = np.clip(base + 0.03 + rng.normal(0, 0.02, 300), 0, 1)
    mask = rng.uniform(size=300) < 0.6
    parts = seen_parts(base, head, mask, n_boot=4000)
    for part, keep in (("seen", mask), ("unseen", ~mask), ("all", np.ones(300, bool))):
        ref = stats.bootstrap((head[keep], base[keep]), lambda h, b, axis=-1: (h - b).mean(axis), paired=True,
                              vectorized=True, n_resamples=4000, method="percentile", rng=1).confidence_interval
        lo, hi = parts[part]["ci"]["delta"]
        assert lo == pytest.approx(ref.low, abs=0.002) and hi == pytest.approx(ref.high, abs=0.002)
        assert parts[part]["n"] == int(keep.sum())
        assert parts[part]["delta"] == pytest.approx((head[keep] - base[keep]).mean())
    assert parts["all"]["ci"]["delta"][1] - parts["all"]["ci"]["delta"][0] < 0.01  # unpaired: ~0.09 wide


def test_seeds_and_small_parts():
    """Several seeds: the part's figure is the mean over seeds; a one-query part has no interval; none: n 0."""
    base = np.array([0.2, 0.4, 0.6])
    head = np.array([[0.3, 0.5, 0.9], [0.1, 0.7, 0.5]])
    parts = seen_parts(base, head, np.array([True, False, False]))
    assert parts["seen"] == {"n": 1, "baseline": 0.2, "head": pytest.approx(0.2), "delta": pytest.approx(0.0),
                             "ci": {"baseline": None, "head": None, "delta": None}}
    assert parts["unseen"]["head"] == pytest.approx((0.5 + 0.9 + 0.7 + 0.5) / 4)
    assert seen_parts(base, head, np.zeros(3, bool))["seen"] == {"n": 0}


def test_pairs_with_unlabeled_anchor_seen_when_a_positive_was_trained(seen_world, tmp_path):
    """A pairs table with --unlabeled: a test anchor is seen when one of its positives is a training positive."""
    import polars as pl

    from .conftest import write_json_lines

    rng = random.Random(5)
    anchors = [f"{sentence(rng, 3)} u {i}" for i in range(40)]
    unique = [f"{sentence(rng, 5)} v {i}" for i in range(33)]
    positives = [unique[i % 33] for i in range(40)]  # test anchors 33..39 share a positive with train anchors 0..6
    splits = ["train"] * 24 + ["dev"] * 8 + ["test"] * 8
    pairs = tmp_path / "pairs.parquet"
    pl.DataFrame({"anchor": anchors, "positive": positives, "split": splits}).write_parquet(pairs)
    corpus = write_json_lines(tmp_path / "corpus.jsonl", [{"_id": f"d{i}", "title": "", "text": sentence(rng, 7)
                                                           + f" w {i}"} for i in range(20)])
    store, head = tmp_path / "store", tmp_path / "head"
    r = cli("featurize", "--model", seen_world["model"], "--data", pairs, "--unlabeled", corpus, "--store", store,
            "--dtype", "float32")
    assert r.exit_code == 0, r.output
    r = cli("train-head", "--store", store, "--data", pairs, "--unlabeled", corpus, "--out", head, *FAST)
    assert r.exit_code == 0, r.output
    trained = {p for p, s in zip(positives, splits) if s == "train"}
    expected = {}
    for split in ("dev", "test"):
        by_anchor: dict = {}
        for a, p, s in zip(anchors, positives, splits):
            if s == split:
                by_anchor.setdefault(a, set()).add(p)
        n_seen = sum(bool(ps & trained) for ps in by_anchor.values())
        expected[split] = {"seen": n_seen, "unseen": len(by_anchor) - n_seen, "all": len(by_anchor)}
    assert expected == {"dev": {"seen": 0, "unseen": 8, "all": 8}, "test": {"seen": 7, "unseen": 1, "all": 8}}
    m = json.loads((head / "metrics.json").read_text())
    for split, parts in (("test", m["parts"]), ("dev", m["dev"]["parts"])):
        assert {p: parts[p]["n"] for p in ("seen", "unseen", "all")} == expected[split]
    assert m["dev"]["parts"]["note"].startswith("all unseen")


def test_grid_leaderboard_has_seen_and_unseen_columns(seen_world, tmp_path):
    """Each configuration's test seen / unseen column is the mean over its seeds of its per-query values on the
    hand-made parts (results.parquet's test_items), the frozen baseline rows too."""
    import polars as pl

    w = seen_world
    grid, out = tmp_path / "grid.toml", tmp_path / "grid"
    grid.write_text('[grid]\nlr = [1e-3]\nseed = [0, 1]\n[fixed]\nepochs = 1\nhidden = 16\nbatch_size = 8\n'
                    'mined_k = 2\n')
    r = cli("grid", "--store", w["store"], "--data", w["beir"], "--grid", grid, "--out", out)
    assert r.exit_code == 0, r.output
    md = (out / "leaderboard.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| rank"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    for name in ("dev seen (2)", "dev unseen (2)", "test seen (6)", "test unseen (6)"):
        assert name in cells, header
    frame = pl.read_parquet(out / "results.parquet")
    items = np.array([json.loads(x) for x in frame["test_items"]])  # (seeds, 12) in sorted query id order
    order = sorted(SEEN_TEST + UNSEEN_TEST)
    seen = np.array([q in SEEN_TEST for q in order])
    head_row = next(line for line in md.splitlines() if line.startswith("| 1 "))
    row = dict(zip(cells, [c.strip() for c in head_row.strip("|").split("|")]))
    assert float(row["test seen (6)"]) == pytest.approx(items[:, seen].mean(), abs=1e-4)
    assert float(row["test unseen (6)"]) == pytest.approx(items[:, ~seen].mean(), abs=1e-4)
    frozen = next(line for line in md.splitlines() if "frozen baseline (cosine)" in line)
    assert dict(zip(cells, [c.strip() for c in frozen.strip("|").split("|")]))["test seen (6)"] != ""
    # the grid keeps its training judgements: `cli eval` of one of its heads splits as train-head's would
    assert (out / "judgements.parquet").is_file()
    r = cli("eval", "--store", w["store"], "--head", f"{out}#rank=1", "--data", w["beir"], "--out", tmp_path / "ev")
    assert r.exit_code == 0, r.output
    parts = json.loads((tmp_path / "ev" / "metrics.json").read_text())["parts"]
    assert {p: parts[p]["n"] for p in ("seen", "unseen", "all")} == {"seen": 6, "unseen": 6, "all": 12}


def test_compare_rows_are_split_by_seen_and_unseen():
    """compare's in-domain rows on each part: the figure and the paired difference seed by seed, on the part's
    queries only (the reference: the same two-level bootstrap on the cut values)."""
    from headstore.heads.experiments.compare.setups import REFERENCE
    from headstore.heads.experiments.compare.table import build_rows, tables
    from headstore.heads.scoring.bootstrap import two_level_ci

    from .test_compare_stats import _report_world

    cfg, built, evals, steps, (_, ref, setup, cosine) = _report_world("mean")
    mask = np.random.default_rng(3).uniform(size=ref.shape[1]) < 0.6
    for rec in evals.values():
        rec["seen"] = mask.tolist()
    rows = {r["setup"]: r for r in build_rows(cfg, built, evals, {}, steps)}
    for part, keep in (("seen", mask), ("unseen", ~mask)):
        tuned = rows["finetuned-head"]["parts"][f"ind {part}"]
        assert tuned["n"] == int(keep.sum())
        assert tuned["vs_frozen_head"]["diff"] == pytest.approx(setup[0][keep].mean() - ref[0][keep].mean())
        frozen = rows[REFERENCE]["parts"][f"ind {part}"]
        assert frozen["mean"] == pytest.approx(ref[:, keep].mean(1).mean())
        assert frozen["ci"] == pytest.approx(list(two_level_ci(ref[:, keep], 500)))
        cos = rows["frozen-cosine"]["parts"][f"ind {part}"]
        assert cos["vs_frozen_head"]["diff"] == pytest.approx(cosine[keep].mean() - ref[:, keep].mean(1).mean())
    assert rows[REFERENCE]["datasets"]["ind"]["mean"] == pytest.approx(ref.mean(1).mean())  # the whole unchanged
    cfg.ood_exclude_overlap, cfg.seeds, cfg.tune_seeds = False, (0, 1, 2), 1
    _, md = tables(cfg, list(rows.values()))
    assert "## ind split by seen / unseen queries" in md and "Δ ind unseen" in md


def test_distill_splits_every_column(seen_world, tmp_path):
    """cli distill: the student's metrics.json parts on the hand-made qrels, the teacher column's parts equal to
    `cli eval` of the teacher (an independent pipeline), the terminal's seen / unseen rows; the student's folder
    keeps its judgements."""
    w = seen_world
    out = tmp_path / "student"
    r = cli("distill", "--store", w["store"], "--data", w["beir"], "--teacher", w["head"], "--out", out, *FAST,
            "--teacher-k", "3", "--random-k", "2", "--search-k", "5")
    assert r.exit_code == 0, r.output
    m = json.loads((out / "metrics.json").read_text())
    assert {p: m["parts"][p]["n"] for p in ("seen", "unseen", "all")} == {"seen": 6, "unseen": 6, "all": 12}
    assert {p: m["dev"]["parts"][p]["n"] for p in ("seen", "unseen")} == {"seen": 2, "unseen": 2}
    r_eval = cli("eval", "--store", w["store"], "--head", w["head"], "--data", w["beir"], "--out", tmp_path / "ev")
    assert r_eval.exit_code == 0, r_eval.output
    want = json.loads((tmp_path / "ev" / "metrics.json").read_text())["parts"]
    for part in ("seen", "unseen"):
        assert m["teacher"]["parts"]["test"][part]["head"] == pytest.approx(want[part]["head"], abs=1e-6)
    assert "test seen (6)" in r.output and "dev unseen (2)" in r.output
    assert json.loads((out / "config.json").read_text())["judged"]["pairs"] == {"train": 20, "dev": 4}


def test_index_says_how_many_documents_training_judged(seen_world, tmp_path):
    """cli index: the judged share of the indexed corpus (d0..d19 by train, d1, d2, d35, d36 by dev: 22 of 40),
    and the index's copy of the head keeps its judgements (cli eval of it splits as the head does)."""
    pytest.importorskip("faiss")
    w = seen_world
    out = tmp_path / "index"
    r = cli("index", "--store", w["store"], "--head", w["head"], "--data", w["beir"], "--out", out)
    assert r.exit_code == 0, r.output
    info = json.loads((out / "index.json").read_text())
    assert info["judged"] == {"documents": 22, "of": 40}
    assert "22 of the 40 documents were judged" in r.output
    r = cli("index", "--store", w["store"], "--head", w["head"], "--data", w["other"], "--out", tmp_path / "other")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "other" / "index.json").read_text())["judged"]["note"].startswith("all unseen")
    copy = out / "head"
    r = cli("eval", "--store", w["store"], "--head", copy, "--data", w["beir"], "--out", tmp_path / "ev")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "ev" / "metrics.json").read_text())["parts"]["seen"]["n"] == 6


def test_a_head_whose_record_file_is_missing_says_so(seen_world, tmp_path):
    import shutil

    w = seen_world
    head = tmp_path / "copied"
    shutil.copytree(w["head"], head)
    (head / "judgements.parquet").unlink()
    r = cli("eval", "--store", w["store"], "--head", head, "--data", w["beir"], "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert "parts" not in m and "judgements.parquet: missing" in m["parts_note"]
    assert "note: " in r.output and "not split into seen and unseen" in r.output


def test_a_damaged_record_is_a_one_line_error(seen_world, tmp_path):
    import shutil

    from .conftest import assert_bad_input

    w = seen_world
    head = tmp_path / "damaged"
    shutil.copytree(w["head"], head)
    data = (head / "judgements.parquet").read_bytes()
    (head / "judgements.parquet").write_bytes(data[:len(data) // 2])  # truncated
    r = cli("eval", "--store", w["store"], "--head", head, "--data", w["beir"], "--out", tmp_path / "out")
    assert_bad_input(r, "judgements.parquet", "cannot be read", "train the head again")
    assert not (tmp_path / "out").exists()  # nothing written half
    import polars as pl

    pl.DataFrame({"x": [1]}).write_parquet(head / "judgements.parquet")  # another file under its name
    r = cli("eval", "--store", w["store"], "--head", head, "--data", w["beir"], "--out", tmp_path / "out")
    assert_bad_input(r, "judgements.parquet", "not a head's judgements")


def test_a_record_built_on_an_earlier_one_keeps_each_pair_once(tmp_path):
    """write_judgements with `earlier` (cli finetune: the source head's record): the union of both, a pair in
    both once, an old record without a split column kept with a null split; the counts are the file's rows."""
    import polars as pl

    from headstore.heads.artefacts.judged import SCHEMA, write_judgements
    from headstore.heads.kinds import PairSet

    class Store:  # text ids t0..t9 at rows 0..9
        def scan_texts(self, columns):
            return pl.LazyFrame({"text_id": [f"t{i}" for i in range(10)], "row": list(range(10))})

    pairs = {"train": PairSet(np.array([0, 1]), np.array([5, 6])), "dev": PairSet(np.array([2]), np.array([7]))}
    earlier = pl.DataFrame({"query_id": ["t0", "t3"], "document_id": ["t5", "t8"], "label": [None, None]},
                           schema={k: SCHEMA[k] for k in ("query_id", "document_id", "label")})
    entry = write_judgements(tmp_path, Store(), pairs, earlier)
    rows = pl.read_parquet(tmp_path / entry["file"]).rows()
    expected = {("t0", "t5", None, None), ("t3", "t8", None, None), ("t0", "t5", None, "train"),
                ("t1", "t6", None, "train"), ("t2", "t7", None, "dev")}
    assert set(rows) == expected and len(rows) == len(expected)
    assert entry["pairs"] == {None: 2, "train": 2, "dev": 1} and entry["documents"] == 4
    (tmp_path / "b").mkdir()
    again = write_judgements(tmp_path / "b", Store(), pairs, pl.read_parquet(tmp_path / entry["file"]))
    assert again == entry  # built on itself: nothing added
