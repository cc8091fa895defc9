"""Command-line options for reading a dataset: `--format` (choices from the FORMATS registry) and the
options of labelled texts, shared by every command that reads datasets (featurize, train-head, eval, grid,
index, forgetting, setfit-compare), `--unlabeled` (featurize, train-head, eval, grid, index) and
`--score-range` (train-head, eval, grid)."""
from __future__ import annotations

import math
from contextlib import contextmanager

import click

from headstore.data.dataset import FORMATS, PAIR_ROLES
from headstore.data.errors import SettingError
from headstore.data.labels import label_format

LABEL_OPTION_NAMES = ("text_column", "label_column", "label_sep", "label_columns")


def option_name(setting: str) -> str:
    """The command-line option of a config field, as typed (`anchor_weight` -> `--anchor-weight`): the one
    mapping from config fields to options; the generated options (heads.settings.options), the hand-written ones of
    featurize, adapt and finetune, and every message about them follow it."""
    return "--" + setting.replace("_", "-")


@contextmanager
def named_as_typed():
    """Config checks (a SettingError naming a field) raised while building a config from command-line options
    become one-line errors naming the option as typed (`--anchor-weight must be ...`); a config file or the
    API keeps the field's name."""
    try:
        yield
    except SettingError as err:
        raise ValueError(f"{option_name(err.setting)} {err.problem}") from None


class NonEmptyPath(click.Path):
    """The type of every path option and argument (--data, --store, --out, --head, --grid, --index,
    --model, store PATH, ...): the value as given (a str), refused when empty -- read as a path, ''
    is the current folder (`--data ''` would featurize whatever is there). Nothing else is checked
    here unless asked (readable=False): readers and writers name what is wrong with a path."""

    def __init__(self, **kwargs):
        kwargs.setdefault("readable", False)
        super().__init__(**kwargs)

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value:
            self.fail("the path is empty (give a file or folder; '.' for the current folder)",
                      param, ctx)
        return super().convert(value, param, ctx)


PATH = NonEmptyPath()


def format_option(f):
    """--format: a dataset format of data.dataset.FORMATS (the registry is the one list of choices)."""
    return click.option("--format", "data_format", type=click.Choice(sorted(FORMATS)), default=None,
                        help="Dataset format (default: detected).")(f)


def unlabeled_option(f):
    """--unlabeled PATH (repeatable): unlabeled texts beside the pairs (data.unlabeled)."""
    return click.option("--unlabeled", type=PATH, multiple=True,
                        help="Unlabeled texts (.txt one per line, JSONL with text, Parquet text column, a BEIR corpus; "
                             "repeatable): for positive pairs the corpus each anchor ranks its positives against "
                             "(dev, test), the pool impostors are mined from and the anchor's sample.")(f)


class ScoreRange(click.ParamType):
    """`LO,HI`, two finite numbers with LO < HI (the scale of an STS table's scores)."""

    name = "LO,HI"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            lo, hi = (float(v) for v in str(value).split(","))
        except ValueError:
            self.fail(f"{value!r} is not LO,HI (two numbers, e.g. 0,5)", param, ctx)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            self.fail(f"{value!r}: need finite LO < HI", param, ctx)
        return lo, hi


score_range_option = click.option(
    "--score-range", type=ScoreRange(), default=None,
    help="Scale of an STS table's scores, e.g. 0,5 (default: detected as 0-1 or 0-5); "
         "a score outside it is an error naming its row.")


def label_options(f):
    """--text-column, --label-column, --label-sep, --label-columns: how to read labelled texts
    (data/labels.py). Any of them implies --format labels; `fold_label_options` turns them into the
    format string (`labels?text_column=body`) that every reader of the dataset understands."""
    options = [
        click.option("--text-column", default=None, help="Labelled texts: the column to encode (20 Newsgroups: body)."),
        click.option("--label-column", default=None, help="Labelled texts: the class column (default label)."),
        click.option("--label-sep", default=None,
                     help="Labelled texts: split labels into levels on this string (e.g. '.' or ':'); 'auto': the "
                          "separator the labels show (':', '.', '/', '>'), flat when none."),
        click.option("--label-columns", default=None,
                     help="Labelled texts: one column per level, coarse to fine, the last the label (level1,level2,label)."),
        click.option("--pair-roles", type=click.Choice(PAIR_ROLES), default=None,
                     help="Pairs tables: symmetric (default: both columns in the document role) or query-document "
                          "(anchors encoded with the query prompt, positives/negatives with the document prompt); "
                          "give the same to featurize and to every command reading the table."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def fold_label_options(data_format: str | None, settings: dict) -> str | None:
    """Pop the label options and --pair-roles from `settings` (click's keyword arguments) into the format
    string (`labels?text_column=body`, `pairs?roles=query-document`)."""
    pair_roles = settings.pop("pair_roles", None)
    folded = label_format(data_format, **{k: settings.pop(k) for k in LABEL_OPTION_NAMES})
    if pair_roles and pair_roles != "symmetric":
        if folded not in (None, "pairs"):
            raise click.UsageError(f"--pair-roles applies to pairs tables, not to --format {folded}")
        return f"pairs?roles={pair_roles}"
    return folded


def label_read_options(f):
    """--format plus the label options."""
    return click.option("--format", "data_format", default=None, help="Dataset format (default: detected).")(label_options(f))
