"""Output folders: a command writes only into a folder that is new, empty, unrelated, or its own.

`cli train-head --out`, `cli eval --out` and `cli grid --out` go through `prepare_output_dir` before any
work starts. It refuses (with the path and what to do) an `--out` that is an existing file, a feature
store (or a folder inside one), or a folder already holding another command's output or another head;
`--overwrite` replaces such an output (its known artefacts are deleted first, other files are left
alone). A feature store is never replaced. `cli grid` may reuse its own folder: that is how it resumes;
with `--overwrite` its own earlier output is replaced too (nothing is resumed).
"""
from __future__ import annotations

import shutil
from pathlib import Path

from headstore.data.files import atomic_write_text

# what each command leaves in its folder; the first file of each list marks the folder as that output
OUTPUTS: dict[str, tuple[str, ...]] = {
    "head": ("head.safetensors", "normalizer.safetensors", "config.json", "metrics.json", "curve.png",
             "judgements.parquet"),
    "grid": ("results.parquet", "grid.toml", "results.csv", "leaderboard.md", "configs.csv", "baseline.json",
             "by_setting.png", "best_curves.png", "heads", "summary.json", "summary.md", "ensembles.json"),
    "finetune": ("finetune.json", "encoder", "head"),
    "compare": ("compare.json", "compare.md", "config.json"),
    "eval": ("metrics.json",),
}
DESCRIPTION = {"head": "trained head (cli train-head)", "grid": "grid (cli grid)",
               "finetune": "fine-tuned encoder (cli finetune)", "compare": "comparison (cli compare)",
               "eval": "evaluation (cli eval)"}
STORE_MARKER = "manifest.json"  # with texts.parquet: a feature store (headstore.featurize.store)
# written (holding the command's kind) before a command's first artefact and removed after its last: a folder
# holding it is an interrupted output (a full disk, a kill), which the same command replaces on its rerun
PARTIAL = ".headstore-partial"


def is_store(path: Path) -> bool:
    return (path / STORE_MARKER).is_file() and ((path / "texts.parquet").exists() or
                                                 (path / "features.zarr").exists())


def output_kind(path: Path) -> str | None:
    """What `path` holds: "store", a key of OUTPUTS, or None (absent, empty or unrelated files)."""
    if not path.is_dir():
        return None
    if is_store(path):
        return "store"
    return next((kind for kind, files in OUTPUTS.items() if (path / files[0]).exists()), None)


def partial_kind(path: Path) -> str | None:
    """The kind of the interrupted output `path` holds (see PARTIAL), None for none."""
    try:
        return (path / PARTIAL).read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def begin_output(out: Path, kind: str) -> None:
    """Mark `out` as being written by a `kind` command (before its first artefact)."""
    atomic_write_text(out / PARTIAL, kind)


def end_output(out: Path) -> None:
    """The command's last artefact is written: `out` is a whole output."""
    (out / PARTIAL).unlink(missing_ok=True)


def clear_partial(out: Path, kind: str) -> bool:
    """Empty `out` when it holds an interrupted `kind` output (written into a folder that was empty); whether
    it did. A folder that is no such output is left as it is."""
    if not out.is_dir() or partial_kind(out) != kind:
        return False
    for child in out.iterdir():
        if child.name != PARTIAL:
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    return True


def prepare_output_dir(out: str | Path, kind: str, overwrite: bool = False, resumable: bool = False,
                       inputs: tuple = (), create: bool = True) -> Path:
    """Check `out` can take a `kind` output (see the module doc) and create it; returns it as a Path.

    `inputs`: the command's input paths (datasets, a head): `out` may not be one of them or lie inside one.
    `create=False` only checks: a command checks before its work and creates (replacing what --overwrite
    replaces) once it has something to write, so a failed run leaves the old output as it was."""
    assert kind in OUTPUTS, kind
    out = Path(out)
    resolved = out.resolve()
    for given in inputs:
        if given is None:
            continue
        path = Path(given).resolve()
        if resolved == path or (path.is_dir() and path in resolved.parents):
            raise ValueError(f"{out}: is {'' if resolved == path else 'inside '}the input {given}; "
                             "--out must be another folder (inputs are never written to)")
    for parent in [out, *out.parents]:
        if is_store(parent):
            raise ValueError(f"{out}: {'is' if parent == out else f'is inside the feature store {parent}, which is'} "
                             "a feature store; --out must be another folder (a store is never overwritten)")
    if out.exists() and not out.is_dir():
        if not overwrite:
            raise ValueError(f"{out}: exists and is a file; --out is a folder (choose another --out, or "
                             "--overwrite to replace the file)")
        if create:
            out.unlink()
    held = output_kind(out)
    if held is not None and partial_kind(out) == kind:  # the same command, interrupted: replaced
        overwrite = True
    if held is not None and (overwrite or not (resumable and held == kind)):
        if not overwrite:
            what = "another " + DESCRIPTION[held] if held == kind else "the output of a " + DESCRIPTION[held]
            raise ValueError(f"{out}: already holds {what} (choose another --out, or --overwrite to replace it)")
        if create:
            _remove_output(out, held)
    if create:
        out.mkdir(parents=True, exist_ok=True)
    return out


def _remove_output(out: Path, kind: str) -> None:
    for name in OUTPUTS[kind]:
        target = out / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
