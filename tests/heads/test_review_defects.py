"""Defects found by the code review of issue 18; each test fails until its defect is fixed.

2. A grid with a class loss (supcon, supcon-kl) on STS / IR / pairs data aborts instead of recording it skipped.
3. `cli eval --exclude-overlap` and `cli train-head --select-ood` with labelled texts end in a traceback.
4. Run files of positive pairs scored as retrieval rank the anchor's own text (the evaluator drops it).
5. The label grid builds a layer-mix head as (in_dim = L*D, mix = 1), train-head as (in_dim = D, mix = L).
6. Label grids skip the --out guard, drop --overwrite, and save heads `GRID#rank=K` cannot load.
7. `import headstore.cli` imports torch (seconds before `cli --help` answers).

Everything goes through the command line (`headstore.cli:main`), files and the public API (`headstore.Head`,
`headstore.Store`), so the tests outlive a restructuring of heads/.
"""
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import headstore
from headstore.data.text_id import text_id

from .conftest import FAST, assert_bad_input, cli
from .finetune_world import sentence, tiny_bert
from .label_world import topic_texts

pytrec_eval = pytest.importorskip("pytrec_eval")

QUICK = ("--epochs", "1", "--hidden", "16", "--batch-size", "8")
MIX = "features+features_layer-2"  # the two layers the world's store holds


def _chain_pairs(rng, n: int, tag: str) -> tuple[list[str], list[str]]:
    """n positive pairs t0->t1, t1->t2, ...: every anchor but the first is also another pair's positive,
    so a query's own text is in the corpus it is ranked against (and never relevant to itself)."""
    texts = [f"{sentence(rng, 5)} {tag} {i}" for i in range(n + 1)]
    return texts[:-1], texts[1:]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny 2-layer BERT; labelled texts A and B (tests/heads/label_world.topic_texts), positive pairs
    whose anchors are also positives, an STS table; one float32 store of layers -1 and -2 holding them all;
    and a supcon-kl head trained on A."""
    root = tmp_path_factory.mktemp("review-defects")
    rng = random.Random(18)
    w = {"root": root, "model": tiny_bert(root / "model", layers=2)}
    w["A"], w["B"] = topic_texts(root)
    anchors, positives, splits = [], [], []
    for split, n in (("train", 40), ("dev", 16), ("test", 16)):
        a, p = _chain_pairs(rng, n, split[:2])
        anchors += a
        positives += p
        splits += [split] * n
    w["pos"] = root / "chain.parquet"
    pl.DataFrame({"anchor": anchors, "positive": positives, "split": splits}).write_parquet(w["pos"])
    n = 48
    w["graded"] = root / "graded.parquet"  # an STS table; its name does not say "sts"
    pl.DataFrame({"sentence1": [sentence(rng) + f" s{i}" for i in range(n)],
                  "sentence2": [sentence(rng) + f" t{i}" for i in range(n)],
                  "score": [rng.uniform(0, 5) for _ in range(n)],
                  "split": ["train"] * 28 + ["dev"] * 10 + ["test"] * 10}).write_parquet(w["graded"])
    w["store"] = root / "store"
    data = [x for k in ("A", "B", "pos", "graded") for x in ("--data", w[k])]
    r = cli("featurize", "--model", w["model"], *data, "--layers", "-1,-2", "--store", w["store"], "--dtype", "float32")
    assert r.exit_code == 0, r.output
    w["head_A"] = root / "head-A"
    r = cli("train-head", "--store", w["store"], "--data", w["A"], "--loss", "supcon-kl", "--out", w["head_A"], *QUICK)
    assert r.exit_code == 0, r.output
    return w


def _write_grid(path: Path, grid: str, fixed: str) -> Path:
    path.write_text(f"[grid]\n{grid}\n[fixed]\n{fixed}\n")
    return path


def test_defect_2_class_losses_on_sts_data_are_skipped_not_fatal(world, tmp_path):
    """A grid listing class losses on an STS table trains the rest and records those combinations skipped,
    with a reason naming the loss and the data kind (as a graded-only loss on positives-only pairs is)."""
    grid = _write_grid(tmp_path / "grid.toml", 'loss = ["l1-energy", "supcon", "supcon-kl"]',
                       "epochs = 1\nhidden = 16\nbatch_size = 8\ndepth = 1")
    out = tmp_path / "grid"
    r = cli("grid", "--store", world["store"], "--data", world["graded"], "--grid", grid, "--out", out)
    assert r.exit_code == 0, (r.output, repr(r.exception))
    rows = pl.read_parquet(out / "results.parquet")
    by_loss = {loss: rows.filter(pl.col("loss") == loss) for loss in ("l1-energy", "supcon", "supcon-kl")}
    assert by_loss["l1-energy"].height == 1 and by_loss["l1-energy"]["status"].to_list() == ["ok"]
    for loss in ("supcon", "supcon-kl"):
        row = by_loss[loss]
        assert row.height == 1 and row["status"].to_list() == ["skipped"], row
        reason = row["reason"][0]
        assert re.search(rf"(?<![\w-]){loss}(?![\w-])", reason), reason  # names the loss
        assert re.search(r"\bsts\b", reason), reason  # and the kind: the file is graded.parquet


def test_defect_3_labelled_texts_with_exclude_overlap_and_select_ood(world, tmp_path):
    """Labelled texts as the other dataset of --exclude-overlap and of --select-ood are meaningful, so all
    three runs must succeed (exit 0), none may end in a traceback:
    - eval on A --exclude-overlap C: A's test texts that C also holds are dropped (metrics.json
      `overlap_dropped` counts them, `n_scored` shrinks by as many);
    - train-head on labelled texts A --select-ood B (labelled): B's dev k-NN accuracy enters selection;
    - train-head on positive pairs --select-ood B (labelled): likewise."""
    a = pl.read_parquet(world["A"])
    a_test = a.filter(pl.col("split") == "test")
    shared = a_test.head(6).with_columns(pl.lit("train").alias("split"))  # 6 of A's test texts, in C's train
    c = tmp_path / "c.parquet"
    pl.concat([pl.read_parquet(world["B"]), shared]).write_parquet(c)
    out = tmp_path / "eval"
    r = cli("eval", "--store", world["store"], "--head", world["head_A"], "--data", world["A"],
            "--exclude-overlap", c, "--out", out)
    assert r.exit_code == 0, (r.output, repr(r.exception))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["overlap_dropped"]["with"] == str(c)
    assert metrics["overlap_dropped"]["test"] == 6, metrics["overlap_dropped"]
    assert metrics["n_scored"]["test"] == a_test.height - 6

    for data, loss in ((world["A"], "supcon-kl"), (world["pos"], "l1-energy")):
        out = tmp_path / f"select-{Path(data).stem}"
        r = cli("train-head", "--store", world["store"], "--data", data, "--loss", loss, "--select-ood", world["B"],
                "--out", out, *FAST)
        assert r.exit_code == 0, (data, r.output, repr(r.exception))
        selection = json.loads((out / "metrics.json").read_text())["selection"]
        assert list(selection["sets"]) == ["topics-B"], selection


def test_defect_4_pairs_run_file_drops_the_anchors_own_text(world, tmp_path):
    """pytrec_eval on run.test.trec of a positives-only pairs head reproduces metrics.json's nDCG@10: the
    run file ranks exactly as the evaluator does, without a query's own text (unless it is relevant)."""
    out = tmp_path / "head"
    r = cli("train-head", "--store", world["store"], "--data", world["pos"], "--out", out, *FAST)
    assert r.exit_code == 0, r.output
    metrics = json.loads((out / "metrics.json").read_text())
    test = pl.read_parquet(world["pos"]).filter(pl.col("split") == "test")
    qrels: dict = {}
    for anchor, positive in test.select("anchor", "positive").iter_rows():
        qrels.setdefault(text_id(anchor), {})[text_id(positive)] = 1
    run: dict = {}
    own = []
    for line in (out / "run.test.trec").read_text().splitlines():
        qid, _, doc, _, score, _ = line.split()
        run.setdefault(qid, {})[doc] = float(score)
        if qid == doc and doc not in qrels.get(qid, {}):
            own.append(line)
    assert set(run) == set(qrels)
    assert not own, f"{len(own)} of {len(run)} queries rank their own text, e.g. {own[0]!r}"
    per_query = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    ndcg = sum(q["ndcg_cut_10"] for q in per_query.values()) / len(per_query)
    assert ndcg == pytest.approx(metrics["head"]["manhattan_ndcg@10"], abs=1e-6)


def test_defect_5_label_grid_builds_layer_mix_heads_as_train_head(world, tmp_path):
    """The same labelled texts, array `features+features_layer-2` and settings through train-head and
    through a label grid (one seed, shots 0) train the same model: the same test metrics, and the grid's
    rank-1 head has train-head's shape (in_dim = D, mix = 2)."""
    settings = {"loss": "supcon-kl", "epochs": 1, "hidden": 16, "batch_size": 8, "depth": 1, "lr": 1e-3,
                "mined_k": 2, "seed": 0, "shots": 0}
    head_dir = tmp_path / "head"
    options = [x for k, v in settings.items() for x in (f"--{k.replace('_', '-')}", v)]
    r = cli("train-head", "--store", world["store"], "--data", world["A"], "--array", MIX, "--out", head_dir, *options)
    assert r.exit_code == 0, r.output
    fixed = "\n".join(f"{k} = {json.dumps(v)}" for k, v in settings.items() if k != "loss") + f'\narray = "{MIX}"'
    grid = _write_grid(tmp_path / "grid.toml", 'loss = ["supcon-kl"]', fixed)
    out = tmp_path / "grid"
    r = cli("grid", "--store", world["store"], "--data", world["A"], "--grid", grid, "--out", out)
    assert r.exit_code == 0, r.output
    metrics = json.loads((head_dir / "metrics.json").read_text())
    row = pl.read_parquet(out / "results.parquet").filter(pl.col("status") == "ok").row(0, named=True)
    for name in (metrics["primary"], metrics["primary"].replace("knn_accuracy", "map")):
        assert row[f"test_{name}"] == pytest.approx(metrics["head"][name], abs=1e-6), name
    trained, gridded = headstore.Head.load(head_dir), headstore.Head.load(f"{out}#rank=1")
    dim = headstore.Store.open(world["store"]).features(rows=[0]).shape[1]
    assert (trained.head_config.in_dim, trained.head_config.mix) == (dim, 2)
    assert (gridded.head_config.in_dim, gridded.head_config.mix) == (dim, 2)


def test_defect_6_label_grid_out_guard_loadable_heads_and_overwrite(world, tmp_path):
    """Label grids treat --out as other grids do: (a) a folder holding a train-head output is refused
    (exit 2, `Error:` naming it); (b) `GRID#rank=1` loads and embeds stored features; (c) --overwrite
    replaces a finished grid (its heads retrain) where a plain rerun resumes from its results."""
    held = tmp_path / "held"
    shutil.copytree(world["head_A"], held)
    grid = _write_grid(tmp_path / "grid.toml", 'loss = ["supcon-kl"]\nseed = [0, 1]',
                       "epochs = 1\nhidden = 16\nbatch_size = 8\ndepth = 1")
    args = ("grid", "--store", world["store"], "--data", world["A"], "--grid", grid)
    assert_bad_input(cli(*args, "--out", held), held)  # (a)
    assert not (held / "results.parquet").exists()

    out = tmp_path / "grid"  # (b)
    r = cli(*args, "--out", out)
    assert r.exit_code == 0, r.output
    head = headstore.Head.load(f"{out}#rank=1")
    store = headstore.Store.open(world["store"])
    texts = pl.read_parquet(world["A"])["text"].to_list()[:5]
    z = head.embed(store.features(rows=store.rows_for(texts), array=head.array))
    assert z.shape == (5, head.out_dim)

    results = pl.read_parquet(out / "results.parquet")  # (c): mark every finished result as stale
    metric_cols = [c for c in results.columns if c.startswith("test_") and results[c].dtype.is_float()]
    assert metric_cols
    results.with_columns([pl.lit(-1.0).alias(c) for c in metric_cols]).write_parquet(out / "results.parquet")
    r = cli(*args, "--out", out)  # resumes: the finished heads are not retrained
    assert r.exit_code == 0, r.output
    assert (pl.read_parquet(out / "results.parquet").filter(pl.col("status") == "ok")[metric_cols[0]] == -1.0).all()
    r = cli(*args, "--out", out, "--overwrite")  # replaces: every head retrains
    assert r.exit_code == 0, r.output
    again = pl.read_parquet(out / "results.parquet").filter(pl.col("status") == "ok")
    assert again.height == results.filter(pl.col("status") == "ok").height
    for c in metric_cols:
        assert (again[c] != -1.0).all(), f"--overwrite kept the old results ({c} still -1)"


def test_defect_7_importing_the_cli_does_not_import_torch():
    """`import headstore.cli` leaves torch unimported (so `cli --help` answers at once), and --help still
    lists every command."""
    root = str(Path(headstore.__file__).parent.parent)  # the folder holding the package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    probe = subprocess.run([sys.executable, "-c", "import sys, headstore.cli; print('torch' in sys.modules)"],
                           capture_output=True, text=True, env=env, timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "False", "import headstore.cli imported torch"
    r = cli("--help")
    assert r.exit_code == 0, r.output
    for command in ("featurize", "store", "train-head", "eval", "grid", "export", "index", "search", "adapt",
                    "finetune", "compare", "forgetting", "setfit-compare"):
        assert f"  {command} " in r.output, (command, r.output)
