"""How `cli finetune` trains the encoder under the head: the registry of setups (`--setup`).

A setup is one module here and one line in TUNINGS. Each is a Tuning: `attach(model)` changes the loaded
encoder in place as the setup needs and returns the parameters that train, in blocks top first (one per
transformer layer, so --unfreeze top-k / gradual and --layer-lr-decay apply to every setup);
`save(model, enc_dir, base_dir)` writes the encoder's weights so that `cli featurize --model enc_dir` gives
the trained encoder's features.
"""
from __future__ import annotations

from headstore.heads.apply.tunings.adapters import Adapters
from headstore.heads.apply.tunings.base import Tuning
from headstore.heads.apply.tunings.full import Full
from headstore.heads.apply.tunings.lora import Lora

TUNINGS: dict[str, type[Tuning]] = {
    "full": Full,  # every encoder weight (the blocks --unfreeze picks)
    "adapters": Adapters,  # Houlsby bottleneck adapters; the base frozen and saved unchanged
    "lora": Lora,  # PEFT LoRA on the query/value projections; saved merged (a stock model folder)
}

__all__ = ["TUNINGS", "Tuning"]
