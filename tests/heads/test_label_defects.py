"""Issue 54 items 11, 14, 15: few-shot texts set aside as dev (and an empty dev slice), a classifier head
evaluated on another kind of data, the guard's hint on labelled texts."""
import pytest
from click.testing import CliRunner

from headstore.cli import main
from headstore.heads.settings.config import HeadConfig, TrainConfig

from .recipe_world import recipe_world, train_head


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return recipe_world(tmp_path_factory.mktemp("label-defects"))


def test_one_train_text_per_class_trains_without_a_dev_split(world):
    """Issue 54 item 11: one train text a class left an empty dev slice, then an IndexError in evaluate_labels."""
    r, m = train_head(world, "one.parquet", "one", "--epochs", "2")
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    assert m["n_scored"]["test"] == 20


@pytest.mark.parametrize("shots", [8, 45])
def test_few_shot_draws_from_every_train_text(world, shots):
    """Issue 54 item 11: the dev slice of train is no few-shot text: --shots 8 with a class of 2 texts trains on
    both, --shots 45 --self-train 3 on every train text (38 here), and the notes say the true counts."""
    args = ["--shots", str(shots), "--epochs", "2"] + (["--self-train", "3", "--solver", "lbfgs", "--loss", "ce",
                                                        "--depth", "1"] if shots == 45 else [])
    r, m = train_head(world, "few.parquet", f"shots-{shots}", *args)
    assert r.exit_code == 0, r.output
    clipped = m["data_report"]["shots_clipped"]
    assert clipped["top1.sub3"] == 2
    if shots == 45:
        assert clipped == {"top0.sub0": 10, "top0.sub1": 10, "top1.sub2": 10, "top1.sub3": 2}
        assert "(32 texts)" in m["dev_made"] and "the 32 shots are every train text" in r.output


def test_a_classifier_head_on_an_sts_table_is_one_line(world):
    """Issue 54 item 14: a KeyError traceback before; now one line naming the kinds it can score."""
    root, store = world
    r, _ = train_head(world, "news.parquet", "ce", "--loss", "ce", "--epochs", "1")
    assert r.exit_code == 0, r.output
    ev = CliRunner().invoke(main, ["eval", "--store", str(store), "--head", str(root / "ce"), "--data",
                                   str(root / "sts.parquet"), "--out", str(root / "ev-sts")])
    assert ev.exit_code != 0 and "Traceback" not in ev.output and ev.exception.__class__ is not KeyError
    assert "classifier head" in ev.output and "labels data only" in ev.output and "sts data" in ev.output


def test_the_guard_hints_only_label_options():
    """Issue 54 item 15: the hint named --graded pearson, an option of graded pairs."""
    from headstore.heads.kinds.labels import KIND

    for loss, depth, normalize in (("ce", 2, "standardize"), ("supcon-kl", 2, "none"), ("ce", 1, "l2")):
        hint = KIND.suggest(None, HeadConfig(depth=depth), TrainConfig(loss=loss, normalize=normalize))
        assert "--graded" not in hint and hint
        assert (f"--loss {loss}" not in hint) and (depth != 1 or "--depth 1" not in hint)
