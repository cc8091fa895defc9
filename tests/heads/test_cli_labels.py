"""Labelled texts through the CLI on a tiny random BERT: featurize --text-column, train-head --hierarchy,
eval, grid sweeping shots x seeds, and SetFit beside headstore (when the optional extra is installed)."""
import json
import random

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

import headstore
from headstore.cli import main
from headstore.heads.artefacts.files import ranked_configs

from .finetune_world import WORDS, tiny_bert


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-labels")
    rng = random.Random(0)
    groups = [WORDS[i::4] for i in range(4)]
    rows = []
    for c in range(4):
        for i in range(15):
            body = " ".join(rng.choice(groups[c]) for _ in range(5)) + f" {c}{i}"
            rows.append({"text": f"From: group{c}\n\n{body}", "body": body, "label": f"top{c // 2}.sub{c}",
                         "split": "train" if i < 10 else "test"})
    pl.DataFrame(rows).write_parquet(root / "news.parquet")
    model = tiny_bert(root / "model", layers=2)
    store = root / "store"
    r = CliRunner().invoke(main, ["featurize", "--model", str(model), "--data", str(root / "news.parquet"),
                                  "--text-column", "body", "--store", str(store), "--dtype", "float32"])
    assert r.exit_code == 0, r.output
    from headstore.featurize.store.reader import FeatureStore

    assert FeatureStore.open(store).n_texts == 60  # the bodies, not the texts with their headers
    return root, store, model


def test_train_head_hierarchy_reports_probe_knn_and_baseline(world):
    root, store, _ = world
    out = root / "head"
    r = CliRunner().invoke(main, ["train-head", "--store", str(store), "--data", str(root / "news.parquet"),
                                  "--text-column", "body", "--label-sep", ".", "--loss", "supcon-kl", "--hierarchy",
                                  "--out", str(out), "--epochs", "2", "--batch-size", "8", "--hidden", "16"])
    assert r.exit_code == 0, r.output
    m = json.loads((out / "metrics.json").read_text())
    assert m["primary"] == "manhattan_knn_accuracy" and m["baseline_primary"] == "cosine_knn_accuracy"
    for block in ("head", "baseline"):
        assert {"probe_accuracy", "probe_macro_f1", "probe_accuracy_level1", "probe_accuracy_level2"} <= set(m[block])
    assert {"manhattan_knn_accuracy", "manhattan_ndcg@10", "manhattan_map", "cosine_knn_accuracy"} <= set(m["head"])
    assert len(m["ci"]["head"]) == 2 and m["data_report"]["n_classes"] == 4
    config = json.loads((out / "config.json").read_text())
    assert config["format"] == "labels?text_column=body&label_sep=." and config["train"]["hierarchy"] is True
    ev = CliRunner().invoke(main, ["eval", "--store", str(store), "--head", str(out), "--data",
                                   str(root / "news.parquet"), "--text-column", "body", "--out", str(root / "ev")])
    assert ev.exit_code == 0, ev.output
    assert json.loads((root / "ev" / "metrics.json").read_text())["head"]["manhattan_knn_accuracy"] >= 0


def test_errors_are_one_line(world):
    root, store, _ = world
    r = CliRunner().invoke(main, ["train-head", "--store", str(store), "--data", str(root / "news.parquet"),
                                  "--text-column", "body", "--loss", "supcon", "--hierarchy", "--out", str(root / "x")])
    assert r.exit_code != 0 and "--hierarchy needs hierarchical labels" in r.output
    r = CliRunner().invoke(main, ["train-head", "--store", str(store), "--data", str(root / "news.parquet"),
                                  "--text-column", "body", "--loss", "mnr", "--out", str(root / "x")])
    assert r.exit_code != 0 and "for labelled texts use one of" in r.output
    r = CliRunner().invoke(main, ["train-head", "--store", str(store), "--data", str(root / "news.parquet"),
                                  "--out", str(root / "x")])  # the `text` column (headers) was never featurized
    assert r.exit_code != 0 and "not in the feature store" in r.output


def test_grid_sweeps_losses_shots_and_seeds(world):
    root, store, _ = world
    grid = root / "grid.toml"
    grid.write_text('[grid]\nloss = ["supcon-kl", "l1-energy", "mnr"]\nshots = [2, 4]\nseed = [0, 1]\n'
                    '[[grids]]\nloss = ["supcon"]\nhierarchy = [true]\n'  # flat labels here: skipped, with the reason
                    '[fixed]\nepochs = 2\nbatch_size = 8\nhidden = 16\n')
    args = ["grid", "--store", str(store), "--data", str(root / "news.parquet"), "--text-column", "body",
            "--grid", str(grid), "--out", str(root / "grid")]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    frame = pl.read_parquet(root / "grid" / "results.parquet")
    ok = frame.filter(pl.col("status") == "ok")
    skipped = frame.filter(pl.col("status") == "skipped")
    assert ok.height == 8 and skipped.height == 5  # mnr: pairs only; --hierarchy: flat labels
    assert skipped.filter(pl.col("hierarchy"))["reason"][0].startswith("news: --hierarchy needs hierarchical labels")
    assert sorted(ok["n_labelled"].unique().to_list()) == [8, 16]  # 2 and 4 texts x 4 classes
    assert ok["base_probe_accuracy"].null_count() == 0 and ok["test_probe_accuracy"].null_count() == 0
    # the baseline of a (shots, seed) is the same whatever the loss
    assert ok.group_by("shots", "seed").agg(pl.col("base_probe_accuracy").n_unique())["base_probe_accuracy"].max() == 1
    summary = json.loads((root / "grid" / "summary.json").read_text())
    assert len(summary) == 4 and all(s["seeds"] == 2 for s in summary)
    assert "head probe_accuracy" in (root / "grid" / "summary.md").read_text()
    groups, _ = ranked_configs(frame)  # seeds of one configuration train in separate stacks: still one config
    assert len(groups) == 4 and all(g.height == 2 for g in groups)
    head = headstore.Head.load(f"{root / 'grid'}#rank=1")  # a label grid's heads load as every grid's do
    assert head.embed(np.zeros((1, head.in_dim), np.float32)).shape == (1, head.out_dim)
    rerun = CliRunner().invoke(main, args)  # every head is finished: nothing retrains
    assert rerun.exit_code == 0 and pl.read_parquet(root / "grid" / "results.parquet").height == 13


def test_setfit_side_by_side(world, monkeypatch):
    pytest.importorskip("setfit")
    root, store, model = world
    r = CliRunner().invoke(main, ["setfit-compare", "--store", str(store), "--data", str(root / "news.parquet"),
                                  "--text-column", "body", "--shots", "2", "--seeds", "0", "--losses", "ce,supcon-kl",
                                  "--setfit-max-steps", "2", "--model", str(model), "--out", str(root / "sf")])
    assert r.exit_code == 0, r.output
    runs = pl.read_parquet(root / "sf" / "runs.parquet")
    assert set(runs["method"]) == {"frozen probe (tuned LR)", "head ce", "head supcon-kl + probe (tuned LR)",
                                   "head supcon-kl k-NN", "SetFit (a) frozen body + LR",
                                   "SetFit (b) contrastive body (capped at 2 steps)"}
    assert runs["accuracy"].is_between(0, 1).all() and (runs["seconds"] > 0).all()
    assert "capped at 2 steps" in (root / "sf" / "setfit.md").read_text()
    body = runs.filter(pl.col("method").str.starts_with("SetFit (b)"))
    assert body["steps"].to_list() == [2]  # the steps SetFit's trainer took, read from its inner ST trainer


def test_setfit_rerun_reuses_only_rows_made_of_the_same_store_and_texts(world, tmp_path):
    """A rerun into the same --out skips the rows it made; rows made of another test sample (or store, or data)
    are refused with a one-line error, and the folder's rows are left as they were."""
    pytest.importorskip("setfit")
    root, store, model = world
    args = ["setfit-compare", "--store", str(store), "--data", str(root / "news.parquet"), "--text-column", "body",
            "--shots", "2", "--seeds", "0", "--losses", "ce", "--no-setfit-body", "--model", str(model),
            "--out", str(tmp_path / "sf")]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    first = pl.read_parquet(tmp_path / "sf" / "runs.parquet")
    assert first.height == 3 and first["made_of"].n_unique() == 1
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert pl.read_parquet(tmp_path / "sf" / "runs.parquet").equals(first)  # nothing re-ran, nothing added
    r = CliRunner().invoke(main, [*args, "--test-per-class", "2"])  # another test sample: other figures
    assert r.exit_code == 2 and "made from another store, dataset or test sample" in r.output, r.output
    assert "Traceback" not in r.output and str(tmp_path / "sf" / "runs.parquet") in r.output
    assert pl.read_parquet(tmp_path / "sf" / "runs.parquet").equals(first)
    first.drop("made_of").write_parquet(tmp_path / "sf" / "runs.parquet")  # rows from before runs were keyed
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "rows written before runs were keyed" in r.output, r.output
    (tmp_path / "sf" / "runs.parquet").write_bytes(b"PAR1 cut short")  # a run killed mid-write by hand
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "cannot be read" in r.output and "Traceback" not in r.output, r.output


def test_setfit_rows_of_another_head_recipe_or_setfit_version_are_refused(world, tmp_path, monkeypatch):
    """Issue 54, item 6: a row's `made_of` holds headstore's head recipe and SetFit's version; rows made before
    either changed (e.g. before the self-training default) are never reused under today's labels."""
    pytest.importorskip("setfit")
    from headstore.data import keys

    root, store, model = world
    args = ["setfit-compare", "--store", str(store), "--data", str(root / "news.parquet"), "--text-column", "body",
            "--shots", "2", "--seeds", "0", "--losses", "ce", "--no-setfit-body", "--model", str(model),
            "--out", str(tmp_path / "sf")]
    assert CliRunner().invoke(main, args).exit_code == 0
    first = pl.read_parquet(tmp_path / "sf" / "runs.parquet")
    for name, patch in (("head recipe", lambda m: m.setitem(keys.RECIPES, "train-head", 99)),
                        ("SetFit version", lambda m: m.setattr(
                            "headstore.heads.experiments.labels.setfit.library_version",
                            lambda dist: "9.9" if dist == "setfit" else keys.library_version(dist)))):
        with monkeypatch.context() as m:
            patch(m)
            r = CliRunner().invoke(main, args)
        assert r.exit_code == 2 and "another head recipe or SetFit version" in r.output, (name, r.output)
        assert len(r.output.strip().splitlines()) == 1
        assert pl.read_parquet(tmp_path / "sf" / "runs.parquet").equals(first)


def test_forgetting_and_setfit_bad_options_are_clear_errors(world, tmp_path):
    """Both commands go through the cli's one error path: `Error: ...`, exit 2, no traceback."""
    root, store, _ = world
    data = root / "news.parquet"
    run = lambda *a: CliRunner().invoke(main, [str(x) for x in a])  # noqa: E731
    r = run("forgetting", "--store", store, "--out", tmp_path / "f")
    assert r.exit_code == 2 and "Error: give --task-a and --task-b" in r.output and "Traceback" not in r.output
    r = run("forgetting", "--store", store, "--out", tmp_path / "f2", "--data", data,
            "--task-a", data)
    assert r.exit_code == 2 and "not both" in r.output
    r = run("setfit-compare", "--store", store, "--data", tmp_path / "missing.parquet", "--out", tmp_path / "s",
            "--text-column", "body")
    assert r.exit_code == 2 and "Error:" in r.output and "Traceback" not in r.output


def test_more_shots_than_a_class_has_is_said_on_the_terminal_and_in_metrics(world):
    """--shots above a class's training texts (issue 32 item 4): every class trains on all of its texts, and the
    terminal and metrics.json say which classes and how many texts each has."""
    root, store, _ = world
    args = ["train-head", "--store", str(store), "--data", str(root / "news.parquet"), "--text-column", "body",
            "--loss", "supcon-kl", "--epochs", "1", "--batch-size", "8", "--hidden", "16"]
    r = CliRunner().invoke(main, [*args, "--shots", "1000", "--out", str(root / "many-shots")])
    assert r.exit_code == 0, r.output
    m = json.loads((root / "many-shots" / "metrics.json").read_text())
    clipped = m["data_report"]["shots_clipped"]
    assert sorted(clipped) == [f"top{c // 2}.sub{c}" for c in range(4)]  # every class has 10 train texts
    assert all(0 < n <= 10 for n in clipped.values())
    assert f"({sum(clipped.values())} texts)" in m["dev_made"]  # all of each class's texts were drawn
    line = next(x for x in r.output.splitlines() if x.startswith("note: --shots 1000"))
    assert all(f"{name} {n}" in line for name, n in clipped.items())
    r = CliRunner().invoke(main, [*args, "--shots", "2", "--out", str(root / "two-shots")])
    assert r.exit_code == 0 and "note: --shots" not in r.output, r.output
    assert "shots_clipped" not in json.loads((root / "two-shots" / "metrics.json").read_text())["data_report"]
    grid = root / "shots-grid.toml"
    grid.write_text('[grid]\nshots = [2, 1000]\n[fixed]\nloss = "supcon-kl"\nepochs = 1\nhidden = 16\n')
    r = CliRunner().invoke(main, ["grid", "--store", str(store), "--data", str(root / "news.parquet"), "--text-column",
                                  "body", "--grid", str(grid), "--out", str(root / "shots-grid"), "--dry-run"])
    assert r.exit_code == 0 and line.strip() in r.output and "note: --shots 2 " not in r.output, r.output
