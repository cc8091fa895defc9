"""Bad input around grids, heads and search, through the CLI or the API (issue 22, items 5, 10, 11, 12, 15, 16;
docs/bad-input.md): a truncated results.parquet, a head config that does not fit its weights, an empty
--label-sep, a setting in both [grid] and [fixed], an unknown grid selector, the plan of a grid (--dry-run),
and what `cli search` caps or cuts."""
import json
import shutil

import pytest

import headstore
from headstore.heads.settings.config import HeadConfig

from .conftest import assert_bad_input, cli

GRID = '[grid]\nloss = ["mnr", "l1-energy"]\nseed = [0, 1]\n[fixed]\nepochs = 1\nhidden = 16\nbatch_size = 8\n'


def grid_file(tmp_path, text=GRID):
    path = tmp_path / "grid.toml"
    path.write_text(text)
    return path


def test_resuming_a_grid_whose_results_are_truncated_names_the_file(data_world, tmp_path):
    out = tmp_path / "g"
    args = ("grid", "--store", data_world["store"], "--data", data_world["sts05"], "--grid", grid_file(tmp_path),
            "--out", out)
    assert cli(*args).exit_code == 0
    results = out / "results.parquet"
    results.write_bytes(results.read_bytes()[:100])
    assert_bad_input(cli(*args), results, "cannot be read", "--overwrite")


@pytest.mark.parametrize("edit, needle", [({"depth": "two"}, "depth must be an integer"),
                                          ({"depth": 3}, "do not match the weights")])
def test_a_head_config_that_does_not_fit_its_weights_is_refused(data_world, tmp_path, edit, needle):
    head = tmp_path / "head"
    shutil.copytree(data_world["head"], head)
    config = json.loads((head / "config.json").read_text())
    config["head"].update(edit)
    (head / "config.json").write_text(json.dumps(config))
    r = cli("eval", "--store", data_world["store"], "--head", head, "--data", data_world["pos"], "--out",
            tmp_path / "ev")
    assert_bad_input(r, head / "config.json", needle)


def test_an_empty_label_sep_is_refused(data_world, tmp_path):
    r = cli("train-head", "--store", data_world["store"], "--data", data_world["sts05"], "--format", "labels",
            "--label-sep", "", "--out", tmp_path / "h")
    assert_bad_input(r, "--label-sep must be a non-empty string")


def test_a_setting_in_grid_and_fixed_is_refused_naming_it(data_world, tmp_path):
    path = grid_file(tmp_path, '[grid]\nlr = [1e-3, 3e-3]\n[fixed]\nlr = 1e-2\nepochs = 1\n')
    r = cli("grid", "--store", data_world["store"], "--data", data_world["sts05"], "--grid", path,
            "--out", tmp_path / "g")
    assert_bad_input(r, path, "lr in both [grid] and [fixed]")


def test_an_unknown_grid_selector_names_the_valid_ones(data_world, tmp_path):
    out = tmp_path / "g"
    assert cli("grid", "--store", data_world["store"], "--data", data_world["sts05"], "--grid",
               grid_file(tmp_path), "--out", out).exit_code == 0
    with pytest.raises(ValueError, match=r"'bogus=1' is no grid selector.*rank=K.*id=HEAD_ID.*ensemble=K"):
        headstore.Head.load(f"{out}#bogus=1")


def test_a_grid_says_its_plan_and_dry_run_trains_nothing(data_world, tmp_path):
    out = tmp_path / "g"
    path = grid_file(tmp_path, GRID.replace('"l1-energy"]', '"l1-energy", "supcon"]'))
    r = cli("grid", "--store", data_world["store"], "--data", data_world["sts05"], "--grid", path, "--out", out,
            "--dry-run")
    assert r.exit_code == 0, r.output
    assert "grid plan: 4 head(s) to train in 2 stack(s); 2 skipped" in r.output and "rough time" in r.output
    assert not out.exists()  # nothing written
    r = cli("grid", "--store", data_world["store"], "--data", data_world["sts05"], "--grid", path, "--out", out)
    assert r.exit_code == 0 and "grid plan: 4 head(s) to train" in r.output
    r = cli("grid", "--store", data_world["store"], "--data", data_world["sts05"], "--grid", path, "--out", out,
            "--dry-run")
    assert "grid plan: 0 head(s) to train in 0 stack(s); 0 skipped (cannot apply); 6 already finished" in r.output


def test_search_says_what_it_capped_and_cut(data_world, tmp_path):
    pytest.importorskip("faiss")
    idx = tmp_path / "idx"
    assert cli("index", "--store", data_world["store"], "--head", data_world["head"], "--data", data_world["pos"],
               "--out", idx).exit_code == 0
    n_items = json.loads((idx / "index.json").read_text())["n"]
    long_query = " ".join(["alpha beta gamma"] * 400)
    r = cli("search", "--index", idx, "--query", "alpha beta", "--query", long_query, "--k", n_items + 50)
    assert r.exit_code == 0, r.output
    assert f"--k {n_items + 50} is more than the {n_items} items of the index" in r.output
    assert "1 of 2 queries are longer than the encoder's" in r.output


def test_head_config_check_accepts_a_matching_config(data_world):
    head = headstore.Head.load(data_world["head"])
    assert isinstance(head.head_config, HeadConfig)
