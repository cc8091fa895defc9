"""What a derived artefact is keyed by (docs/guide/store.md, "Keys of derived results").

The rule, for every cache and resumable folder (a `cli compare` step, a finetune checkpoint, an MLM adaptation's
checkpoint, a setfit-compare row, ...):
- the RESOLVED value of every setting that made it (`resolved`: every field of the config, defaults included),
  never only "what differs from the defaults": a default changed in the code is a changed key;
- a recipe version (`RECIPES`, `recipe`), bumped when that code's numbers change, so a result of older code is
  never taken for one of today's;
- for every dataset it read, a digest of what it read (`content_digest`: the bytes, not the path or the mtime),
  so a file edited in place, or replaced, is a changed key; a file that is gone is a one-line error.
Never a path: a path says where, not what.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, is_dataclass
from pathlib import Path

# recipe name -> version. Bump a version when the numbers of that code change (a fix of a loss, a new default,
# another data split): every artefact of the old version is then made again, never reused. Grid heads, distill
# targets and the export cache carry versions of their own (heads.experiments.grid.spec.GRID_VERSION,
# heads.training.distill_targets.TARGETS_FORMAT, featurize.encoder.exported.EXPORT_VERSION).
RECIPES = {
    "featurize": 1,  # a store's features (cli featurize; the store's fingerprint also holds its numerics)
    "train-head": 1,  # a head trained on stored features (cli train-head)
    "finetune": 1,  # an encoder tuned with its head (cli finetune: full, adapters, LoRA)
    "adapt": 1,  # MLM adaptation and the probe MLM head (cli adapt)
    "eval": 1,  # a head's and the frozen features' figures on a dataset (cli eval)
    "mlm-loss": 1,  # the MLM loss on held-out text (forgetting)
    "setfit-compare": 1,  # a setfit-compare row: its split, its head or SetFit run, its scoring
}


def recipe(name: str) -> str:
    """"name/version" of a recipe of RECIPES: what a key holds and a table's note lists."""
    return f"{name}/{RECIPES[name]}"


def resolved(config) -> dict:
    """Every setting of a config dataclass with the value it resolves to (TrainConfig: flat, its to_dict),
    defaults included: what a key holds. A `device` setting is keyed by the kind it resolves to here
    (`device_kind`: "auto" is cuda or cpu), since a card's numerics are not a CPU's."""
    if hasattr(config, "to_dict"):
        values = config.to_dict()
    else:
        assert is_dataclass(config), type(config)
        values = asdict(config)
    if isinstance(values.get("device"), str):
        values["device"] = device_kind(values["device"])
    return values


def device_kind(device: str) -> str:
    """The kind of device a setting resolves to on this machine: "auto" -> "cuda" where torch sees a card, else
    "cpu"; "cuda:1" -> "cuda" (which card of a box does not change the numbers)."""
    if device == "auto":
        import torch  # here: only a key with an "auto" device needs it

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device.split(":", 1)[0]


def library_version(dist: str) -> str:
    """The installed version of distribution `dist` ("absent" when it is not installed): a key's part where a
    library makes the numbers (SetFit's runs, an exported encoder's runtime)."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file())


_MEMO: dict[tuple, str] = {}  # (path, each file's name, size, times, inode): its digest, within one process


def content_digest(path: str | Path, option: str = "--data") -> str:
    """sha256 (first 16 hex) of a dataset's contents: a file's bytes; a folder's files (each relative name and
    bytes, in name order). ValueError naming `option` and the path when it is gone."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{option} {path}: no such file or folder (a result made from it is not reused "
                         "without it)")
    files = _files(path)
    stats = [(str(f.relative_to(path)) if f != path else "", os.stat(f)) for f in files]
    memo = (str(path.resolve()), tuple((name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
                                       for name, st in stats))
    if memo not in _MEMO:
        h = hashlib.sha256()
        for f, (name, st) in zip(files, stats):
            size = st.st_size
            h.update(json.dumps([name, size]).encode())
            with f.open("rb") as stream:
                while block := stream.read(1 << 22):
                    h.update(block)
        _MEMO[memo] = h.hexdigest()[:16]
    return _MEMO[memo]


def contents(paths, option: str = "--data") -> list[str] | str | None:
    """content_digest of each path of a list (a list), of one path (a string), None for None."""
    if paths is None:
        return None
    if isinstance(paths, (str, Path)):
        return content_digest(paths, option)
    return [content_digest(p, option) for p in paths]
