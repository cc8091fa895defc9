"""The command-line options of a head's settings, generated from the config dataclasses (torch-free).

Every field of `HeadConfig` and of `TrainConfig`'s sections marked for the command line becomes one option
(`depth` -> `--depth`, `layer_norm` -> `--layer-norm/--no-layer-norm`), with its default, its choices and
its help from the field's metadata (heads.settings.config): a setting is defined once. The settings whose default
depends on the kind of data (`KIND_DEPENDENT`) default to unset on the command line, so the task kind can
fill them in (heads.kinds; config.json "defaults" says which applied). A config check that fails on an
option's value names the option as typed (`named_as_typed`).
"""
from __future__ import annotations

import typing
from dataclasses import MISSING, fields

import click

from headstore.data.options import named_as_typed, option_name  # the one field -> option mapping
from headstore.heads.settings.config import KIND_DEPENDENT, SECTIONS, HeadConfig, TrainConfig

KIND_HELP = ("Default {default} for IR and pairs data; graded (STS) tables and labelled texts take their own "
             "(config.json \"defaults\" says which applied).")


def _click_type(hint):
    """The click type of a field's type hint (Optional[X] -> X)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return {int: int, float: float, str: str, bool: bool}[args[0]]


def _option(f, hint):
    meta = f.metadata
    name = option_name(f.name)[2:]
    help_text = meta.get("help") or None
    if f.type in ("bool", bool) or hint is bool:
        return click.option(f"--{name}/--no-{name}", default=f.default, show_default=True, help=help_text)
    if f.name in KIND_DEPENDENT:
        kind_help = meta.get("kind_help") or KIND_HELP.format(default=f.default)
        kind = click.Choice(list(meta["choices"])) if meta.get("choices") else _click_type(hint)
        return click.option(f"--{name}", type=kind, default=None,
                            help=f"{help_text} {kind_help}" if help_text else kind_help)
    kind = click.Choice(list(meta["choices"])) if meta.get("choices") else _click_type(hint)
    return click.option(f"--{name}", type=kind, default=f.default, show_default=f.default is not None,
                        help=help_text)


def setting_fields() -> list:
    """(field, type hint) of every setting offered on the command line: the head's shape, then the
    training sections in the order of heads.settings.config.SECTIONS."""
    out = []
    for cls in (HeadConfig, *SECTIONS.values()):
        hints = typing.get_type_hints(cls)
        out += [(f, hints[f.name]) for f in fields(cls) if f.metadata.get("cli", True) and f.default is not MISSING]
    return out


def head_and_train_options(f):
    """Decorate a click command with an option per setting (module doc)."""
    for field_, hint in reversed(setting_fields()):
        f = _option(field_, hint)(f)
    return f


def configs_from_options(settings: dict) -> tuple[HeadConfig, TrainConfig, tuple[str, ...], dict]:
    """(head config, train config, the kind-dependent settings left unset, the other options) of a command's
    keyword arguments: the settings are taken out, everything else is returned as it was."""
    head_keys = {f.name for f in fields(HeadConfig)}
    names = {f.name for f, _ in setting_fields()}
    unset = tuple(k for k in KIND_DEPENDENT if settings.get(k) is None)
    given = {k: v for k, v in settings.items() if k in names and (v is not None or k not in KIND_DEPENDENT)}
    with named_as_typed():
        head = HeadConfig(**{k: v for k, v in given.items() if k in head_keys})
        train = TrainConfig(**{k: v for k, v in given.items() if k not in head_keys})
    rest = {k: v for k, v in settings.items() if k not in names}
    return head, train, unset, rest
