import pytest

from headstore.heads.experiments.grid import head_id, read_grid


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
