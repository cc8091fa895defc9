"""cli compare chooses each tuned setup's encoder lr on dev (issue 37 section 3): every candidate of the grid at
the first tuning seed is its own step, the one with the best dev figure is that seed's run and its lr is kept
for the other seeds; a rerun reuses every candidate."""
import json
import math

import pytest
from click.testing import CliRunner

from headstore.cli import main
from headstore.heads.experiments.compare import table as compare_table
from headstore.heads.experiments.compare.run import load_compare_config
from headstore.heads.experiments.compare.setups import pick_lr

from .compare_world import TINY_HEAD, tiny_featurize, write_compare_toml
from .finetune_world import tiny_beir, tiny_bert

GRID = (0.1, 1.0, 10.0)  # far apart: the candidates' dev figures differ
BASE_LR = 1e-2


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp-lr")
    model = tiny_bert(root / "model", layers=2)
    beir = tiny_beir(root / "in-domain", n_docs=80, n_train=60, n_test=10)
    cfg = root / "compare.toml"
    write_compare_toml(cfg, {
        "data": {"in_domain": beir},
        "featurize": tiny_featurize(model),
        "head": {**TINY_HEAD, "mined_k": 2, "epochs": 1},
        "finetune": {"device": "cpu", "encoder_lr": BASE_LR, "lr_grid": list(GRID), "max_epochs": 2, "patience": 1,
                     "dev_docs": 20},
        "compare": {"seeds": [0, 1], "setups": ["frozen-head", "finetuned-head"], "n_boot": 200}})
    return root, cfg


def _records(out, prefix: str) -> list[dict]:
    return [json.loads((d / "step.json").read_text()) for d in sorted(out.glob(f"{prefix}*"))]


def test_lr_is_chosen_on_dev_at_the_first_seed_and_kept(world, monkeypatch):
    root, cfg = world
    out = root / "out"
    built = {}
    real = compare_table.write_report

    def keep_built(cfg, out_dir, b, *args, **kwargs):  # the report is written as ever; Built is kept to check
        built.update(b)
        return real(cfg, out_dir, b, *args, **kwargs)

    monkeypatch.setattr(compare_table, "write_report", keep_built)
    args = ["compare", "--config", str(cfg), "--out", str(out), "--no-mlm"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    candidates = _records(out, "finetuned-s0-lr")
    dev = {rec["settings"]["finetune"]["encoder_lr"]: rec["result"]["best_dev"] for rec in candidates}
    assert sorted(dev) == pytest.approx(sorted(BASE_LR * f for f in GRID))
    assert len(set(dev.values())) > 1, dev  # the choice is not a tie
    best = max(dev, key=lambda lr: dev[lr])  # plain reference: the highest best dev figure
    t0, t1 = built["finetuned"][0].tuning, built["finetuned"][1].tuning
    assert t0["encoder_lr"] == t1["encoder_lr"] == best and t0["chosen_at_seed"] == t1["chosen_at_seed"] == 0
    assert [lr for lr, _ in t0["candidates"]] == pytest.approx([BASE_LR * f for f in GRID])
    assert dict(t0["candidates"]) == dev
    # the chosen candidate's run is seed 0's run: its encoder is the one featurized and evaluated
    chosen = next(rec for rec in candidates if rec["settings"]["finetune"]["encoder_lr"] == best)
    assert built["finetuned"][0].model_dir.parent.name == f"finetuned-s0-lr{best:g}-{chosen['key']}"
    # the cost of the choice is seed 0's
    assert set(built["finetuned"][0].steps) >= {f"finetuned-s0-lr{BASE_LR * f:g}" for f in GRID}
    # seed 1: one run, at the chosen lr; its own epochs and stop
    (seed1,) = _records(out, "finetuned-s1-")
    assert seed1["settings"]["finetune"]["encoder_lr"] == best
    assert t1["best_epoch"] == seed1["result"]["best_epoch"] and t1["stopped_because"] in ("patience", "max_epochs")
    assert t0["epochs_run"] == chosen["result"]["epochs_run"]
    # a rerun reuses every candidate and every other step
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and "running" not in r.output, r.output


def test_pick_lr_takes_the_best_finite_figure_first_in_grid_order():
    assert pick_lr({1e-3: 0.5, 2e-3: 0.7, 4e-3: 0.6}) == 2e-3
    assert pick_lr({1e-3: 0.7, 2e-3: 0.7, 4e-3: 0.6}) == 1e-3  # a tie: the first
    assert pick_lr({1e-3: math.nan, 2e-3: None, 4e-3: 0.1}) == 4e-3  # no figure is never chosen
    assert pick_lr({1e-3: None, 2e-3: None, 4e-3: None}) == 2e-3  # no dev at all: the middle (the default)


def test_lr_grid_is_a_finetune_setting(world, tmp_path):
    _, cfg = world
    assert load_compare_config(str(cfg)).lr_grid == GRID
    bad = tmp_path / "bad.toml"
    bad.write_text(cfg.read_text().replace(f"lr_grid = {list(GRID)}", "lr_grid = [1.0, -2.0]"))
    with pytest.raises(ValueError, match="lr_grid"):
        load_compare_config(str(bad))
