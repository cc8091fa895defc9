"""What a run that changes the encoder leaves on disk, besides the weights transformers saves.

- `copy_sidecars(model_dir, out_dir)`: the sentence-transformers files of the source model, copied beside
  a saved encoder (`cli adapt`, `cli finetune`), so the output folder stays a sentence-transformers model
  and keeps `max_seq_length` (featurize's default max_length): `modules.json`,
  `sentence_bert_config.json`, `config_sentence_transformers.json` and the module folders
  `modules.json` names (`1_Pooling`, ...).
- `write_checkpoint` / `read_checkpoint`: a resumable training state in one folder (model, optimizer,
  RNG states, a JSON state), replaced atomically: written under a temporary name, the old folder
  renamed aside, the new one renamed in, the old one removed; a run killed between the two renames
  leaves `NAME.old`, which `read_checkpoint` takes.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

SIDECAR_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


def _module_dirs(model_dir: Path) -> list[str]:
    """The sub-folders a sentence-transformers model's modules.json names (the root Transformer is "")."""
    modules = model_dir / "modules.json"
    if not modules.is_file():
        return []
    return [m["path"] for m in json.loads(modules.read_text()) if m.get("path")]


def copy_sidecars(model_dir: str | Path, out_dir: str | Path, extra: tuple[str, ...] = ()) -> list[str]:
    """Copy the sentence-transformers files (and `extra` files) of `model_dir` that exist into `out_dir`;
    returns the names copied."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    copied = []
    for name in (*SIDECAR_FILES, *extra):
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out_dir / name)
            copied.append(name)
    for name in _module_dirs(model_dir):
        if (model_dir / name).is_dir():  # Normalize has no folder of its own
            shutil.copytree(model_dir / name, out_dir / name, dirs_exist_ok=True)
            copied.append(name)
    return copied


def write_checkpoint(folder: str | Path, model, optimizer, state: dict, generator: torch.Generator) -> None:
    """Replace `folder` with model weights, optimizer state, RNG states (torch, CUDA, `generator`) and
    `state` (JSON)."""
    from safetensors.torch import save_model

    final = Path(folder)
    old, tmp = final.with_name(final.name + ".old"), final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    rng = {"torch": torch.get_rng_state(), "mask": generator.get_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def checkpoint_state(folder: str | Path) -> tuple[Path, dict] | None:
    """(the folder to resume from, its JSON state), or None when there is no checkpoint."""
    folder = Path(folder)
    if not folder.is_dir() and folder.with_name(folder.name + ".old").is_dir():
        folder = folder.with_name(folder.name + ".old")  # interrupted between the two renames
    if not folder.is_dir():
        return None
    return folder, json.loads((folder / "state.json").read_text())


def read_checkpoint(folder: Path, model, optimizer, generator: torch.Generator) -> None:
    """Load what `write_checkpoint` saved into `model`, `optimizer`, the RNGs and `generator`."""
    from safetensors.torch import load_model

    load_model(model, str(folder / "model.safetensors"))
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=True))
    rng = torch.load(folder / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    generator.set_state(rng["mask"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
