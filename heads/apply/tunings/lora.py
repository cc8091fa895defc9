"""Setup "lora": LoRA (Hu et al. 2021) through PEFT on each layer's query and value projections
(featurize.encoder.architectures names them per architecture), the rest of the encoder frozen.

The encoder folder it writes holds the MERGED weights (W + alpha/r * B A, PEFT's merge_and_unload): a stock
model folder that transformers, sentence-transformers and `cli featurize --model` load unchanged, with
the features the trained LoRA gave.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from headstore.heads.apply.tunings.base import Blocks, Tuning

LORA_DROPOUT = 0.1  # PEFT's and Hu et al.'s usual dropout on the low-rank path


class Lora(Tuning):
    name = "lora"
    default_lr = 5e-4  # Hu et al. 2021's rate for RoBERTa-base (4e-4..5e-4); B starts at zero, so step 0 = base

    def attach(self, model) -> Blocks:
        from headstore.featurize.encoder.architectures import layout_of, transformer_layers  # here: it imports torch

        try:  # here: peft is the optional extra headstore[tuning]
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise ValueError("--setup lora needs PEFT: pip install 'headstore[tuning]'") from None
        self.targets = list(layout_of(model).lora_targets)
        config = LoraConfig(r=self.cfg.lora_rank, lora_alpha=self.cfg.lora_alpha, lora_dropout=LORA_DROPOUT,
                            target_modules=self.targets, bias="none")
        with warnings.catch_warnings():  # PEFT 0.21 asks transformers 5 by the old name (its warning, not ours)
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
            self.peft = get_peft_model(model, config)
        # PEFT replaced the target Linears inside `model` itself: calling `model` runs the LoRA path
        return [[(n, p) for n, p in layer.named_parameters() if "lora_" in n]
                for layer in reversed(transformer_layers(model))]

    def save(self, model, enc_dir: Path, base_dir: Path) -> None:
        merged = self.peft.merge_and_unload()  # the same modules, the low-rank updates folded into W
        merged.save_pretrained(str(enc_dir), safe_serialization=True)

    def describe(self) -> dict:
        return {"lora_rank": self.cfg.lora_rank, "lora_alpha": self.cfg.lora_alpha, "lora_dropout": LORA_DROPOUT,
                "lora_targets": getattr(self, "targets", None)}
