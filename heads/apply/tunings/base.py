"""The interface every setup in TUNINGS implements."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # the registry imports no torch (`import headstore.cli` stays light); setups import it when used
    pass

Blocks = "list[list[tuple[str, torch.nn.Parameter]]]"  # trainable parameters per block, top first


class Tuning:
    """One way of training the encoder under a head. `cfg` is the run's FinetuneConfig (its setup's settings:
    adapter_size, lora_rank, lora_alpha)."""

    name: ClassVar[str]
    default_lr: ClassVar[float]  # the encoder-side peak lr when --encoder-lr is not given

    def __init__(self, cfg):
        self.cfg = cfg

    def attach(self, model) -> Blocks:
        """Change `model` in place as the setup needs; the parameters that train, in blocks top first."""
        raise NotImplementedError

    def save(self, model, enc_dir: Path, base_dir: Path) -> None:
        """Write the trained encoder's weights and config.json into `enc_dir` (tokenizer and
        sentence-transformers sidecars are written by finetune)."""
        raise NotImplementedError

    def describe(self) -> dict:
        """The setup's settings, for finetune.json."""
        return {}


def copy_base_weights(base_dir: Path, enc_dir: Path) -> None:
    """The base model's config and weights files, copied byte for byte."""
    for path in sorted(base_dir.iterdir()):
        if path.is_file() and (path.suffix == ".safetensors" or path.name in ("config.json",
                                                                               "model.safetensors.index.json")):
            shutil.copy2(path, enc_dir / path.name)
