"""Stored features in memory, and the normalisation applied before a head.

The normaliser is fitted on the training texts only (never dev/test) and saved with the head, so a
head applied to another dataset (out-of-domain transfer) sees features transformed the same way.
"""
from __future__ import annotations

import numpy as np
import torch
from safetensors.torch import load_file, save

from headstore.data.files import atomic_write_bytes
from headstore.featurize.store import FeatureStore


def load_features(store: FeatureStore, array: str = "features") -> torch.Tensor:
    """The whole feature array of a store as float32, (N, D).

    Never trains on damaged numbers: a missing shard file or a chunk failing its checksum is a
    StoreError naming the file, a NaN/inf feature one naming the rows (`FeatureStore.features`)."""
    return torch.from_numpy(np.ascontiguousarray(store.features(array=array), dtype=np.float32))


class Normalizer:
    """x -> ((x - center) / scale), then optionally L2-normalised. `none` is the identity."""

    def __init__(self, kind: str, center: torch.Tensor, scale: torch.Tensor):
        self.kind, self.center, self.scale = kind, center, scale

    @classmethod
    def fit(cls, kind: str, x: torch.Tensor) -> "Normalizer":
        """x (n, D): the features of the training texts."""
        D = x.shape[1]
        center = torch.zeros(D)
        scale = torch.ones(D)
        if kind in ("center", "center-l2", "standardize"):
            center = x.mean(0)
        if kind == "standardize":
            scale = x.std(0).clamp_min(1e-6)
        return cls(kind, center, scale)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "none":
            return x
        y = (x - self.center) / self.scale
        if self.kind in ("l2", "center-l2"):
            y = torch.nn.functional.normalize(y, dim=-1)
        return y

    def save(self, path) -> None:
        tensors = {"center": self.center.detach().cpu().contiguous(), "scale": self.scale.detach().cpu().contiguous()}
        atomic_write_bytes(path, save(tensors, metadata={"kind": self.kind}))

    @classmethod
    def load(cls, path) -> "Normalizer":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            kind = (f.metadata() or {}).get("kind", "none")
        t = load_file(str(path))
        return cls(kind, t["center"], t["scale"])
