"""Options named as typed and conflicting settings said (issue 32 items 2 and 3; docs/bad-input.md): a check
that lives in a config class names the option the user typed (`--anchor-weight`, not `anchor_weight`), and
`--prompt-name` with an explicit prompt is refused naming both."""
import pytest

from headstore.data.errors import SettingError
from headstore.heads.settings.config import TrainConfig
from headstore.heads.settings.options import option_name, setting_fields

from .conftest import FAST, assert_bad_input, cli


@pytest.mark.parametrize("option, value, problem", [
    ("--anchor-weight", "-1", "must be a finite number >= 0"), ("--strength", "1.5", "must be 'auto' or a number"),
    ("--exact-max", "-5", "must be >= 0"), ("--remine-every", "0", "must be >= 1"), ("--pool-k", "0", "must be >= 10"),
    ("--shots", "-1", "must be >= 0"), ("--per-class", "1", "must be >= 2"), ("--mined-k", "-1", "must be >= 0"),
    ("--batch-size", "1", "must be >= 2"), ("--warmup-ratio", "1.5", "must be in [0, 1]"),
    ("--q-start", "0", "must be a finite number > 0"), ("--genuine-weight", "-1", "must be a finite number >= 0"),
    ("--tau", "0", "must be a finite number > 0"), ("--depth", "-1", "must be >= 0"), ("--hidden", "0", "must be >= 1"),
    ("--dropout", "1", "must be in [0, 1)"), ("--mix-init", "1.5", "must be in (0, 1)"),
    ("--eval-every", "-1", "must be >= 0"),
])
def test_train_head_names_the_option_as_typed(data_world, tmp_path, option, value, problem):
    r = cli("train-head", "--store", data_world["store"], "--data", data_world["pos"], "--out", tmp_path / "h",
            *FAST, option, value)
    last = assert_bad_input(r, f"Error: {option} {problem}", value)
    field = option[2:].replace("-", "_")
    assert field not in last.replace(option, "")  # the field's name appears nowhere else
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize("option, value, problem", [
    ("--top-k", "0", "must be >= 1"), ("--unfreeze-interval", "0", "must be >= 1"),
    ("--encoder-lr", "0", "must be a finite number > 0"), ("--head-lr", "-1", "must be a finite number > 0"),
    ("--layer-lr-decay", "0", "must be in (0, 1]"), ("--batch-size", "1", "must be >= 2"),
    ("--max-steps", "0", "must be >= 1"),
])
def test_finetune_names_the_option_as_typed(data_world, tmp_path, option, value, problem):
    r = cli("finetune", "--head", data_world["head"], "--out", tmp_path / "ft", option, value)
    assert_bad_input(r, f"Error: {option} {problem}", value)
    assert not (tmp_path / "ft").exists()


@pytest.mark.parametrize("command, option, value, problem", [
    ("featurize", "--max-length", "1", "must be >= 2"), ("featurize", "--batch-tokens", "0", "must be >= 1"),
    ("adapt", "--max-steps", "0", "must be >= 1"), ("adapt", "--batch-size", "0", "must be >= 1"),
    ("adapt", "--save-every", "0", "must be >= 1"), ("adapt", "--epochs", "0", "must be > 0"),
])
def test_featurize_and_adapt_name_the_option_as_typed(data_world, tmp_path, command, option, value, problem):
    out = ("--store", tmp_path / "s") if command == "featurize" else ("--out", tmp_path / "s")
    r = cli(command, "--model", data_world["model"], "--data", data_world["sts05"], *out, option, value)
    assert_bad_input(r, f"Error: {option} {problem}", value)
    assert not (tmp_path / "s").exists()


def test_config_files_and_the_api_keep_the_field_name():
    """The same check read from a config file or the API names the setting as written there."""
    with pytest.raises(SettingError, match=r"^anchor_weight must be a finite number >= 0"):
        TrainConfig(anchor_weight=-1.0)
    assert {option_name(f.name) for f, _ in setting_fields()} >= {"--anchor-weight", "--remine-every", "--pool-k"}


@pytest.mark.parametrize("explicit", [("--query-prompt", "q: "), ("--document-prompt", "d: "),
                                      ("--query-prompt", "q: ", "--document-prompt", "d: ")])
def test_prompt_name_with_an_explicit_prompt_is_refused_naming_both(data_world, tmp_path, explicit):
    r = cli("featurize", "--model", data_world["model"], "--data", data_world["sts05"], "--store", tmp_path / "s",
            "--prompt-name", "query", *explicit)
    assert_bad_input(r, "--prompt-name 'query'", *explicit[::2])
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").iterdir())
