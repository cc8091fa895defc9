"""An out-of-domain set never scores a text the head trained on (issue 54, items 2 and 12): items sharing a text
with the task or with its --unlabeled texts are dropped and counted (terminal and metrics.json) in `cli distill
--transfer`, `cli grid --transfer`, `--select-ood` and `cli eval` of a head trained with --unlabeled; the line names
the files and options; a set left with nothing to score is one line naming the file and the option."""
from __future__ import annotations

import json

import polars as pl
import pytest

from .conftest import FAST, assert_bad_input, cli

DEV, TEST = range(40, 44), range(50, 56)  # sts05 rows (dev 36-47, test 48-59) whose sentence1 is an unlabeled text


@pytest.fixture(scope="module")
def unlabeled(data_world, tmp_path_factory):
    """A file of unlabeled texts: four dev and six test sentences of sts05 (texts already in the store)."""
    sts = pl.read_parquet(data_world["sts05"])
    path = tmp_path_factory.mktemp("overlap") / "unlabeled.txt"
    path.write_text("\n".join(sts["sentence1"][i] for i in (*DEV, *TEST)) + "\n")
    return path


def _ok(r):
    assert r.exit_code == 0, r.output
    return r.output


def test_distill_transfer_drops_the_items_whose_text_the_student_trained_on(data_world, unlabeled, tmp_path):
    out = tmp_path / "d"
    said = _ok(cli("distill", "--store", data_world["store"], "--data", data_world["pos"], "--teacher",
                   data_world["head"], "--unlabeled", unlabeled, "--transfer", data_world["sts05"], "--out", out,
                   *FAST, "--unlabeled-anchors", "5"))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["transfer_dropped"] == {"sts05": {"the --unlabeled texts": {"dev": 4, "test": 6}}}
    assert f"--transfer {data_world['sts05']}: dropped 10 (dev: 4, test: 6) sharing a text with the --unlabeled" in said


def test_grid_transfer_and_select_ood_drop_them_too_and_name_the_files(data_world, unlabeled, tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text("[grid]\nseed = [0]\n[fixed]\nepochs = 1\nhidden = 16\nbatch_size = 8\nmined_k = 2\n")
    out = tmp_path / "g"
    said = _ok(cli("grid", "--store", data_world["store"], "--data", data_world["pos"], "--unlabeled", unlabeled,
                   "--grid", grid, "--transfer", data_world["sts05"], "--select-ood", data_world["sts05"],
                   "--out", out))
    assert f"--transfer {data_world['sts05']}: dropped 10 (dev: 4, test: 6) sharing a text with the --unlabeled" in said
    baseline = json.loads((out / "baseline.json").read_text())["features"]
    assert baseline["transfer_dropped"] == {"sts05": {"the --unlabeled texts": {"dev": 4, "test": 6}}}
    assert baseline["selection"]["sets"]["sts05"]["dropped"] == {"the --unlabeled texts": {"dev": 4, "test": 6}}
    # --data a labelled pairs table holding sts05's first 36 sentence pairs: the line blames that file
    part = tmp_path / "part.parquet"
    pl.read_parquet(data_world["labelled"]).head(36).with_columns(
        split=pl.Series(["train"] * 20 + ["dev"] * 8 + ["test"] * 8)).write_parquet(part)
    said = _ok(cli("grid", "--store", data_world["store"], "--data", part, "--grid", grid, "--transfer",
                   data_world["sts05"], "--out", tmp_path / "g2"))
    assert f"--transfer {data_world['sts05']}: dropped 36 (train: 36) sharing a text with --data {part}" in said


def test_train_head_select_ood_and_eval_of_a_head_trained_with_unlabeled_texts(data_world, unlabeled, tmp_path):
    head = tmp_path / "h"
    _ok(cli("train-head", "--store", data_world["store"], "--data", data_world["pos"], "--unlabeled", unlabeled,
            "--select-ood", data_world["sts05"], "--out", head, *FAST))
    sets = json.loads((head / "metrics.json").read_text())["selection"]["sets"]
    assert sets["sts05"]["dropped"] == {"the --unlabeled texts": {"dev": 4, "test": 6}}
    said = _ok(cli("eval", "--store", data_world["store"], "--head", head, "--data", data_world["sts05"],
                   "--out", tmp_path / "e"))
    metrics = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert metrics["unlabeled_dropped"] == {"dev": 4, "test": 6} and "dropped 10" in said
    full = _ok(cli("eval", "--store", data_world["store"], "--head", data_world["head"], "--data",
                   data_world["sts05"], "--out", tmp_path / "e2"))  # a head trained without them: all 12 scored
    assert "unlabeled_dropped" not in json.loads((tmp_path / "e2" / "metrics.json").read_text()) and full


def test_a_transfer_set_whose_every_test_text_the_head_trained_on_is_one_line(data_world, tmp_path):
    """It was `sts_metrics: need two 1-D arrays of equal length >= 2; got (0,), (0,)` (and for labelled pairs
    `pair_metrics: labels must contain both classes`), naming neither the file nor the option."""
    labelled, sts = data_world["labelled"], data_world["sts05"]
    for data, transfer in ((labelled, sts), (sts, labelled)):
        r = cli("distill", "--store", data_world["store"], "--data", data, "--teacher", data_world["head"],
                "--transfer", transfer, "--out", tmp_path / data.stem, *FAST, "--unlabeled-anchors", "5")
        assert_bad_input(r, f"--transfer {transfer}", "12 of the 12 pairs of its 'test' split", f"--data {data}")
        assert not (tmp_path / data.stem).exists()
    r = cli("train-head", "--store", data_world["store"], "--data", data_world["labelled"], "--select-ood",
            data_world["sts05"], "--out", tmp_path / "h", *FAST)  # the selection set: its dev split, the same rule
    assert_bad_input(r, f"--select-ood {data_world['sts05']}", "12 of the 12 pairs of its 'dev' split",
                     f"--data {data_world['labelled']}")


def test_the_issues_case_an_sts_student_trained_on_unlabeled_texts_of_the_transfer_set(data_world, tmp_path):
    """`--data` an STS table, `--unlabeled` three test questions of the positive pairs, `--transfer` the pairs: the
    student trained on those texts (distillation anchors, the anchor's sample), so their queries are not scored
    out of domain (they were, with nothing dropped or counted)."""
    pos = pl.read_parquet(data_world["pos"]).filter(pl.col("split") == "test")
    questions = list(dict.fromkeys(pos["anchor"]))[:3]
    u = tmp_path / "questions.txt"
    u.write_text("\n".join(questions) + "\n")
    out = tmp_path / "d"
    said = _ok(cli("distill", "--store", data_world["store"], "--data", data_world["sts05"], "--teacher",
                   data_world["head"], "--unlabeled", u, "--transfer", data_world["pos"], "--out", out, *FAST,
                   "--unlabeled-anchors", "5", "--pair-weight", "1", "--anchor-weight", "0.5"))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["transfer_dropped"] == {"pos": {"the --unlabeled texts": {"test": 3}}}
    assert metrics["anchor"]["from"] == "the --unlabeled texts" and metrics["anchor"]["rows"] == 3
    assert f"--transfer {data_world['pos']}: dropped 3 (test: 3) sharing a text with the --unlabeled texts" in said
    grid = tmp_path / "grid.toml"
    grid.write_text("[grid]\nanchor_weight = [0.5]\n[fixed]\nepochs = 1\nhidden = 16\nbatch_size = 8\n")
    said = _ok(cli("grid", "--store", data_world["store"], "--data", data_world["sts05"], "--unlabeled", u,
                   "--grid", grid, "--transfer", data_world["pos"], "--out", tmp_path / "g"))
    assert f"--transfer {data_world['pos']}: dropped 3 (test: 3) sharing a text with the --unlabeled texts" in said
