"""A head does not depend on which other datasets share its store (issue 54, item 3): the anchor regulariser
samples only the task's own texts it may train on (its corpus, its --unlabeled texts), so a store grown by an
unrelated dataset gives the same head, bit for bit (the whole-store anchor drew the other dataset's texts)."""
from __future__ import annotations

import json
import shutil

import torch

from headstore.heads.artefacts.head import Head

from .conftest import FAST, assert_bad_input, cli


def _train(store, data, out, *extra):
    r = cli("train-head", "--store", store, "--data", data, "--out", out, *FAST, "--epochs", "2", "--no-guard", *extra)
    assert r.exit_code == 0, r.output
    return json.loads((out / "metrics.json").read_text())


def test_a_store_grown_by_an_unrelated_dataset_gives_the_same_head_bit_for_bit(data_world, tmp_path):
    alone, grown = tmp_path / "alone", tmp_path / "grown"
    r = cli("featurize", "--model", data_world["model"], "--data", data_world["beir"], "--store", alone,
            "--dtype", "float32")
    assert r.exit_code == 0, r.output
    shutil.copytree(alone, grown)
    r = cli("featurize", "--model", data_world["model"], "--data", data_world["sts05"], "--store", grown,
            "--dtype", "float32")
    assert r.exit_code == 0, r.output
    a = _train(alone, data_world["beir"], tmp_path / "head-alone")  # the IR default: anchor weight > 0
    b = _train(grown, data_world["beir"], tmp_path / "head-grown")
    assert json.loads((tmp_path / "head-alone" / "config.json").read_text())["train"]["anchor_weight"] > 0
    ha, hb = Head.load(tmp_path / "head-alone"), Head.load(tmp_path / "head-grown")
    for (name, x), (_, y) in zip(sorted(ha.model.state_dict().items()), sorted(hb.model.state_dict().items())):
        assert torch.equal(x, y), name
    assert a["head"] == b["head"]
    anchor = a["anchor"]  # metrics.json says what was sampled: the corpus documents, no query of any split
    assert anchor["from"] == "the task's corpus documents" and anchor["rows"] > 0 and anchor == b["anchor"]
    assert anchor["dev_test_texts_left_out"] == 0 and anchor["training_texts_left_out"] > 0


def test_positive_pairs_without_unlabeled_texts_leave_the_default_anchor_off_and_refuse_a_given_one(
        data_world, tmp_path):
    """Nothing of their own to anchor on: train-head's IR default turns the anchor off (it drew the whole store:
    other datasets and the pairs' own dev and test texts); an --anchor-weight given is refused in one line."""
    m = _train(data_world["store"], data_world["pos"], tmp_path / "default")
    config = json.loads((tmp_path / "default" / "config.json").read_text())
    assert config["train"]["anchor_weight"] == 0.0 and "anchor" not in m
    assert "the anchor off: no text of the task's own to anchor on (give --unlabeled)" in config["defaults"]
    r = cli("train-head", "--store", data_world["store"], "--data", data_world["pos"], "--out", tmp_path / "given",
            *FAST, "--anchor-weight", "2")
    assert_bad_input(r, "--anchor-weight 2: no text to anchor on", "--unlabeled", "--anchor-data")
    assert not (tmp_path / "given").exists()
