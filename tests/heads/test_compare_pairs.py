"""cli compare on labelled pairs, in domain and out of domain (a tiny random BERT): the report is written, its
figures are AUCs with CIs from the pairs kind's statistic. Before the task kind named its statistic, the
report picked it from the metric's name (`startswith("auc")`), missed `manhattan_auc` / `cosine_auc`, and
crashed after all training had finished."""
import json
import random

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner
from sklearn.metrics import roc_auc_score

from headstore.cli import main

from .finetune_world import sentence, tiny_bert
from .compare_world import TINY_HEAD, tiny_featurize, write_compare_toml


def tiny_pairs(path, seed: int, n: int, splits: bool):
    """Labelled pairs: a positive shares its anchor's words, a negative does not."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        anchor = sentence(rng, 6)
        label = i % 2
        other = anchor if label else sentence(rng, 6)
        rows.append({"anchor": f"{anchor} {i}", "positive": f"{other} {i + 1}", "label": label})
    frame = pl.DataFrame(rows)
    if splits:
        frame = frame.with_columns(pl.Series("split", ["train"] * (n // 2) + ["test"] * (n - n // 2)))
    frame.write_parquet(path)
    return path


def test_compare_reports_labelled_pairs_in_and_out_of_domain(tmp_path):
    model = tiny_bert(tmp_path / "model", layers=2)
    ind = tiny_pairs(tmp_path / "ind.parquet", seed=0, n=80, splits=True)
    ood = tiny_pairs(tmp_path / "ood.parquet", seed=1, n=30, splits=False)
    cfg = tmp_path / "compare.toml"
    write_compare_toml(cfg, {
        "data": {"in_domain": ind, "out_of_domain": [ood]},
        "featurize": tiny_featurize(model),
        "head": {**TINY_HEAD, "normalize": "none", "mined_k": 0, "epochs": 2},
        "compare": {"seeds": [0, 1], "setups": ["frozen-cosine", "frozen-head"], "n_boot": 200}})
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["compare", "--config", str(cfg), "--out", str(out), "--no-mlm"])
    assert r.exit_code == 0, r.output
    rows = {row["setup"]: row for row in json.loads((out / "compare.json").read_text())["rows"]}
    head, cosine = rows["frozen-head"], rows["frozen-cosine"]
    for ds in ("ind", "ood"):
        assert head["datasets"][ds]["metric"].endswith("_auc") and cosine["datasets"][ds]["metric"] == "cosine_auc"
        for row in (head, cosine):
            block = row["datasets"][ds]
            assert 0 <= block["ci"][0] <= block["mean"] <= block["ci"][1] <= 1
        d = cosine["datasets"][ds]["vs_frozen_head"]
        assert d["seeds"] == [0, 1]  # the frozen cosine, the same at every seed, against each head seed
        assert d["diff"] == pytest.approx(cosine["datasets"][ds]["mean"] - head["datasets"][ds]["mean"])
        assert d["ci"][0] <= d["diff"] <= d["ci"][1]
    # the figure is the AUC of the cosine against the labels, recomputed here from the eval record
    record = json.loads(next(out.glob("eval-base-s0-ood-*/step.json")).read_text())["result"]
    want = roc_auc_score(np.asarray(record["gold"]) > 0.5, record["items"]["baseline"])
    assert cosine["datasets"]["ood"]["mean"] == pytest.approx(want)
    assert "auc" in (out / "compare.md").read_text()
