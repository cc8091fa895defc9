"""The tiny `cli compare` configs of the compare tests: one TOML writer and the settings every tiny run shares
(a tiny random model's features in fp32, a small head), so each test states only what it is about."""
import inspect
from pathlib import Path


def tiny_featurize(model) -> dict:
    return {"model": str(model), "dtype": "float32", "batch_tokens": 2048}


TINY_HEAD = {"hidden": 16, "out_dim": 8, "residual": False, "batch_size": 8}  # seconds on 2 CPU cores


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, (str, Path)):
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)


def write_compare_toml(path: Path, sections: dict[str, dict]) -> Path:
    """A compare config at `path`: one [section] per key, its settings in order."""
    text = "".join(f"[{name}]\n" + "".join(f"{k} = {_value(v)}\n" for k, v in values.items()) + "\n"
                   for name, values in sections.items())
    path.write_text(text)
    return path


def patch_default(monkeypatch, cls, name: str, value) -> None:
    """`cls(...)` without `name` now gives `value`: the dataclass __init__'s default changed, as an edit of the
    code would change it (issue 54: a key must see it)."""
    params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.default is not p.empty]
    defaults = list(cls.__init__.__defaults__)
    defaults[[p.name for p in params].index(name)] = value
    monkeypatch.setattr(cls.__init__, "__defaults__", tuple(defaults))
    assert getattr(cls(), name) == value
