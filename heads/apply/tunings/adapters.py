"""Setup "adapters": Houlsby bottleneck adapters (featurize.encoder.adapters) trained inside the frozen encoder.

The encoder folder it writes holds the base model's config and weights byte for byte, plus the adapters'
weights and settings; `cli featurize --model` attaches them (featurize.encoder.model.load_encoder), and its
weights_hash covers them, so the stores it makes carry their own fingerprint.
"""
from __future__ import annotations

from pathlib import Path

from headstore.heads.apply.tunings.base import Blocks, Tuning, copy_base_weights


class Adapters(Tuning):
    name = "adapters"
    # Houlsby et al. 2019 swept 3e-5..1e-3; a one-epoch run of a few dozen steps needs the top of it, and the
    # zero-initialised up-projections start every adapter at the identity, so a high rate cannot wreck the base
    default_lr = 1e-3

    def attach(self, model) -> Blocks:
        from headstore.featurize.encoder.adapters import attach_adapters  # here: it imports torch

        pairs = attach_adapters(model, self.cfg.adapter_size)  # bottom first
        return [list(pair.named_parameters()) for pair in reversed(pairs)]

    def save(self, model, enc_dir: Path, base_dir: Path) -> None:
        from headstore.featurize.encoder.adapters import save_adapters

        copy_base_weights(base_dir, enc_dir)
        save_adapters(model, enc_dir, self.cfg.adapter_size)

    def describe(self) -> dict:
        return {"adapter_size": self.cfg.adapter_size}
