import pytest

from headstore.heads.experiments.grid.spec import head_id, read_grid


def test_read_grid_expands_products_and_extra_grids(tmp_path):
    g = tmp_path / "g.toml"
    g.write_text('[grid]\nloss = ["l1-energy", "mnr"]\nlr = [1e-3, 3e-3]\n'
                 '[[grids]]\nloss = ["l1-energy"]\nq = [10.0, 20.0]\nlr = [1e-3]\n'
                 '[fixed]\nepochs = 3\n')
    combos = read_grid(str(g))
    assert len(combos) == 4 + 2
    assert all(c["epochs"] == 3 for c in combos)
    assert {"loss": "l1-energy", "q": 20.0, "lr": 1e-3, "epochs": 3} in combos


@pytest.mark.parametrize("text, match", [
    ('[grid]\nlos = ["mnr"]\n', "unknown settings.*los"),
    ('[grid]\nloss = "mnr"\n', "non-empty list"),
    ('[gird]\nloss = ["mnr"]\n', "unknown tables"),
    ('[grid\n', "not valid TOML"),
])
def test_read_grid_rejects_bad_files(tmp_path, text, match):
    g = tmp_path / "g.toml"
    g.write_text(text)
    with pytest.raises(ValueError, match=match):
        read_grid(str(g))


def test_head_id_depends_on_every_setting_and_the_store():
    s = {"loss": "l1-energy", "lr": 1e-3}
    base = head_id(s, "data", "fp")
    assert head_id(dict(s), "data", "fp") == base
    assert head_id({**s, "lr": 3e-3}, "data", "fp") != base
    assert head_id(s, "data", "other-fp") != base
    assert head_id(s, "data", "fp", ("cacm",)) != base


def test_a_dropout_heads_id_holds_how_its_masks_are_drawn(monkeypatch):
    """Heads trained with dropout under another mask rule (unseeded masks) are not resumed; others keep their id."""
    import headstore.heads.experiments.grid.spec as spec

    plain, dropped = {"loss": "l1-energy"}, {"loss": "l1-energy", "dropout": 0.1}
    arrays = {"loss": "l1-energy", "array_dropout": 0.3}
    before = [head_id(s, "data", "fp") for s in (plain, dropped, arrays)]
    monkeypatch.setattr(spec, "MASK_RULE", spec.MASK_RULE + 1)
    after = [head_id(s, "data", "fp") for s in (plain, dropped, arrays)]
    assert after[0] == before[0] and after[1] != before[1] and after[2] != before[2]


def test_head_id_hashes_resolved_defaults(monkeypatch):
    """An unset q is hashed as the Q it stands for: retuning the default retrains, spelling it out does not."""
    import headstore.heads.scoring.losses.settings as losses

    from headstore.heads.scoring.losses.settings import DEFAULT_Q

    s = {"loss": "l1-energy", "lr": 1e-3}
    unset = head_id(s, "data", "fp", in_dim=32)
    assert head_id({**s, "q": DEFAULT_Q["l1"]}, "data", "fp", in_dim=32) == unset
    assert head_id({**s, "out_dim": 32}, "data", "fp", in_dim=32) == unset  # out_dim None = in_dim
    assert head_id(s, "data", "fp", in_dim=32, score_range=(0.0, 10.0)) != unset
    monkeypatch.setitem(losses.DEFAULT_Q, "l1", 40.0)
    assert head_id(s, "data", "fp", in_dim=32) != unset


def test_read_grid_uses_every_combination_once(tmp_path):
    from sklearn.model_selection import ParameterGrid

    g = tmp_path / "g.toml"
    g.write_text('[grid]\nloss = ["mnr", "l1-energy"]\nlr = [1e-3, 3e-3, 1e-3]\nseed = [0, 1]\n')
    combos = read_grid(str(g))
    assert len(combos) == 8 and all(c in combos for c in ParameterGrid({"loss": ["mnr", "l1-energy"],
                                                                        "lr": [1e-3, 3e-3], "seed": [0, 1]}))


def test_rows_of_another_grid_version_are_kept_but_never_reused(data_world, tmp_path):
    import json

    import polars as pl

    from .conftest import cli

    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nlr = [1e-3]\nseed = [0, 1]\n[fixed]\nepochs = 1\nhidden = 16\nbatch_size = 8\nmined_k = 2\n')
    out = tmp_path / "g"
    args = ("grid", "--store", data_world["store"], "--data", data_world["pos"], "--grid", grid, "--out", out)
    assert cli(*args).exit_code == 0
    res = pl.read_parquet(out / "results.parquet")
    res.with_columns(pl.lit(1).alias("grid_version"), pl.lit(0.99).alias("test_primary")) \
        .write_parquet(out / "results.parquet")  # as if written by an older headstore
    r = cli(*args)
    assert r.exit_code == 0, r.output
    assert "2 row(s) of grid format version 1 ignored" in r.output
    both = pl.read_parquet(out / "results.parquet")
    assert both.height == 4 and sorted(both["grid_version"].to_list()) == [1, 1, 2, 2]
    configs = pl.read_csv(out / "configs.csv")
    assert configs["seeds"].to_list() == [2] and configs["test_mean"][0] != 0.99
    assert "0.9900" not in (out / "leaderboard.md").read_text()
    assert json.loads(both.filter(pl.col("grid_version") == 2)["history"][0])


def test_an_edited_dataset_retrains_its_heads_and_a_deleted_one_is_a_one_line_error(data_world, tmp_path, monkeypatch):
    """Issue 54, item 10 in `cli grid`: a head id names the dataset by its path, so each row also records the
    digest of the contents its heads read and the train-head recipe (`made_of`); the same path with other contents (score = 5 - score)
    trains every head again, said in one line, and the old rows are neither resumed nor aggregated."""
    import polars as pl

    from .conftest import assert_bad_input, cli

    sts = tmp_path / "sts.parquet"
    pl.read_parquet(data_world["sts05"]).write_parquet(sts)
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nseed = [0, 1]\n[fixed]\nepochs = 1\nhidden = 16\nbatch_size = 8\nmined_k = 2\n')
    out = tmp_path / "g"
    args = ("grid", "--store", data_world["store"], "--data", sts, "--grid", grid, "--out", out)
    assert cli(*args).exit_code == 0
    first = pl.read_parquet(out / "results.parquet")
    r = cli(*args)  # the same contents: every head resumed
    assert r.exit_code == 0 and "ignored" not in r.output and pl.read_parquet(out / "results.parquet").height == 2
    pl.read_parquet(sts).with_columns(score=5.0 - pl.col("score")).write_parquet(sts)
    r = cli(*args)
    assert r.exit_code == 0, r.output
    assert "2 row(s) made from other contents of the datasets" in r.output and "train again" in r.output
    rows = pl.read_parquet(out / "results.parquet")
    assert rows.height == 4 and rows["made_of"].n_unique() == 2
    new = rows.filter(pl.col("made_of") != first["made_of"][0]).sort("seed")
    old = first.sort("seed")
    assert all(abs(a - b) > 1e-6 for a, b in zip(new["test_primary"], old["test_primary"]))  # scored anew
    configs = pl.read_csv(out / "configs.csv")
    assert configs["seeds"].to_list() == [2]  # the old rows are not aggregated with the new
    assert configs["test_mean"][0] == pytest.approx(new["test_primary"].mean(), abs=1e-6)
    from headstore.heads.artefacts.files import select_row

    assert rows.filter(pl.col("aggregated"))["made_of"].unique().to_list() == [new["made_of"][0]]
    assert select_row(out, 1)[0]["made_of"] == new["made_of"][0]  # GRID#rank=1 ranks this run's rows only
    from headstore.data import keys

    monkeypatch.setitem(keys.RECIPES, "train-head", 99)  # the training code's numbers changed
    r = cli(*args)
    assert r.exit_code == 0 and "another train-head recipe" in r.output, r.output
    assert pl.read_parquet(out / "results.parquet").height == 6
    sts.unlink()
    assert_bad_input(cli(*args), str(sts))


def test_the_same_data_under_another_path_trains_nothing_again(data_world, tmp_path):
    """A grid head's id holds the data's contents, never its path: the same file copied elsewhere (or named by a
    relative path instead of an absolute one) resumes every head, and no configuration counts a seed twice."""
    import shutil

    import polars as pl

    from .conftest import cli

    first, second = tmp_path / "a" / "sts.parquet", tmp_path / "b" / "sts.parquet"
    first.parent.mkdir()
    second.parent.mkdir()
    pl.read_parquet(data_world["sts05"]).write_parquet(first)
    shutil.copy(first, second)
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nseed = [0, 1]\n[fixed]\nepochs = 1\nhidden = 16\nbatch_size = 8\nmined_k = 2\n')
    out = tmp_path / "g"
    for data in (first, second):
        r = cli("grid", "--store", data_world["store"], "--data", data, "--grid", grid, "--out", out)
        assert r.exit_code == 0, r.output
    assert "0 head(s) to train" in r.output and pl.read_parquet(out / "results.parquet").height == 2
    assert pl.read_csv(out / "configs.csv")["seeds"].to_list() == [2]
    grid.write_text('[grid]\nseed = [0]\n[fixed]\nepochs = 1\nhidden = 16\nbatch_size = 8\nmined_k = 2\n')
    r = cli("grid", "--store", data_world["store"], "--data", first, "--grid", grid, "--out", out)
    assert r.exit_code == 0 and "1 row(s) of heads this grid does not define" in r.output, r.output
    assert pl.read_csv(out / "configs.csv")["seeds"].to_list() == [1]  # kept in the file, not aggregated
    assert pl.read_parquet(out / "results.parquet")["aggregated"].to_list().count(True) == 1


def test_grid_precision_option_sets_every_head_and_refuses_a_file_that_says_otherwise(tmp_path):
    g = tmp_path / "g.toml"
    g.write_text('[grid]\nlr = [1e-3, 3e-3]\n[fixed]\nepochs = 1\n')
    assert [c["precision"] for c in read_grid(str(g), "bf16")] == ["bf16", "bf16"]
    assert all("precision" not in c for c in read_grid(str(g)))  # unset: the dataclass default, fp32
    g.write_text('[grid]\nlr = [1e-3]\n[fixed]\nprecision = "fp32"\n')
    assert read_grid(str(g), "fp32")[0]["precision"] == "fp32"
    with pytest.raises(ValueError, match="fixes precision = 'fp32'"):
        read_grid(str(g), "bf16")
    g.write_text('[grid]\nlr = [1e-3]\nprecision = ["fp32", "bf16"]\n')
    with pytest.raises(ValueError, match="sweeps precision"):
        read_grid(str(g), "bf16")
