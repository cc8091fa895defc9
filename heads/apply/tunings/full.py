"""Setup "full": fine-tuning, every encoder weight in the blocks --unfreeze picks trains."""
from __future__ import annotations

from pathlib import Path

from headstore.heads.apply.tunings.base import Blocks, Tuning


class Full(Tuning):
    name = "full"
    default_lr = 2e-5  # the usual BERT fine-tuning rate; the head's 1e-3 would wreck pre-training

    def attach(self, model) -> Blocks:
        from headstore.featurize.encoder.architectures import layer_blocks  # here: it imports torch

        return layer_blocks(model)  # [layer L-1, ..., layer 0, embeddings]

    def save(self, model, enc_dir: Path, base_dir: Path) -> None:
        model.save_pretrained(str(enc_dir), safe_serialization=True)
