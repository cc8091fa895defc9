"""A tiny world for the public API, export and search tests: a random BERT, a BEIR folder, a float32
store, a trained head, and heads with random (non-zero) weights of any shape."""
from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import torch

from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.run.local import featurize
from headstore.heads.settings.config import TrainConfig
from headstore.heads.network.features import Normalizer
from headstore.heads.artefacts.head import Head
from headstore.heads.settings.config import HeadConfig
from headstore.heads.network.model import StackedMLP
from headstore.heads.training.run import train_head

from .finetune_world import tiny_beir, tiny_bert


class World:
    def __init__(self, root: Path):
        self.root = root
        self.model = tiny_bert(root / "model", layers=2)
        self.beir = tiny_beir(root / "beir", n_docs=60, n_train=30, n_test=10)
        self.store = root / "store"
        featurize(FeaturizeConfig(model=str(self.model), dtype="float32", batch_tokens=2048), [str(self.beir)],
                  self.store)
        self.head = root / "head"
        train_head(str(self.store), str(self.beir), str(self.head), HeadConfig(hidden=16),
                   TrainConfig(epochs=2, batch_size=8, mined_k=2), progress=False,
                   lexical="off")  # the dense head: its index and search (BM25 beside it: test_lexical.py)

    def random_head(self, name: str, head_cfg: HeadConfig, normalize: str = "l2", seed: int = 0,
                    **train) -> Path:
        """A head directory with the trained head's store and random weights (every layer non-zero, so a
        residual head's g is not 0 and an export that dropped a part would show)."""
        base = Head.load(self.head)
        cfg = replace(head_cfg, in_dim=base.in_dim)
        model = StackedMLP(1, cfg, seeds=[seed])
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name_, p in model.named_parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3 + (1.0 if name_.startswith("ln_weights") else 0.0))
        features = torch.randn(50, base.in_dim, generator=gen) + 0.5
        norm = Normalizer.fit(normalize, features)
        train_cfg = TrainConfig(**{**base.config["train"], "normalize": normalize, **train})
        config = {**base.config, "head": asdict(cfg), "train": train_cfg.to_dict()}
        return Head(model, norm, config, name).save(self.root / name)
