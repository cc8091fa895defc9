"""Stored features in memory, and the normalisation applied before a head.

The normaliser is fitted on the training texts only (never dev/test) and saved with the head, so a
head applied to another dataset (out-of-domain transfer) sees features transformed the same way.
"""
from __future__ import annotations

import numpy as np
import torch
from safetensors.torch import load_file, save

from headstore.data.files import atomic_write_bytes
from headstore.featurize.store.layout import array_dim
from headstore.featurize.store.reader import FeatureStore


MIX_SEP = "+"  # `features+features_layer-4`: several stored arrays (layers), concatenated, for a mixing head


def array_list(array: str) -> list[str]:
    """The store arrays an array spec names: `features` -> [features]; `features+features_layer-4` -> both."""
    names = [a.strip() for a in str(array).split(MIX_SEP)]
    if not all(names) or len(set(names)) != len(names):
        raise ValueError(f"array {array!r}: give store array names joined by '{MIX_SEP}', each once "
                         f"(e.g. features+features_layer-4)")
    return names


def array_widths(store, array: str) -> list[int]:
    """The width of each store array an array spec names (a tap's own, else the store's dim)."""
    manifest = store.manifest
    return [array_dim(manifest, name) if name in manifest.get("arrays", {}) else int(manifest["dim"])
            for name in array_list(array)]


def read_features(store, array: str = "features", rows=None) -> np.ndarray:
    """One stored array, or several joined by '+' side by side, (n, L * D): every row of a FeatureStore
    (rows None), or the given rows of a public `headstore.Store`."""
    parts = [store.features(a) if rows is None else store.features(rows, array=a) for a in array_list(array)]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def load_features(store: FeatureStore, array: str = "features") -> torch.Tensor:
    """The whole feature array of a store as float32, (N, D); for 'a+b' arrays side by side, (N, 2D).

    Never trains on damaged numbers: a missing shard file or a chunk failing its checksum is a
    StoreError naming the file, a NaN/inf feature one naming the rows (`FeatureStore.features`)."""
    return torch.from_numpy(np.ascontiguousarray(read_features(store, array), dtype=np.float32))


class Normalizer:
    """x -> ((x - center) / scale), then optionally L2-normalised. `none` is the identity.

    `blocks` > 1: x holds that many stored arrays side by side (a mixing head's input); centre and scale
    are per column as always, and L2 normalisation is per array."""

    def __init__(self, kind: str, center: torch.Tensor, scale: torch.Tensor, blocks: int = 1):
        self.kind, self.center, self.scale, self.blocks = kind, center, scale, blocks

    @classmethod
    def fit(cls, kind: str, x: torch.Tensor, blocks: int = 1) -> "Normalizer":
        """x (n, D): the features of the training texts (D = blocks * the array dim)."""
        D = x.shape[1]
        center = torch.zeros(D, device=x.device)
        scale = torch.ones(D, device=x.device)
        if kind in ("center", "center-l2", "standardize"):
            center = x.mean(0)
        if kind == "standardize":
            scale = x.std(0).clamp_min(1e-6)
        return cls(kind, center, scale, blocks)

    def to(self, device: str | torch.device) -> "Normalizer":
        """The same normaliser with its centre and scale on `device` (a head evaluated on a GPU)."""
        return Normalizer(self.kind, self.center.to(device), self.scale.to(device), self.blocks)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "none":
            return x
        y = (x - self.center) / self.scale
        if self.kind in ("l2", "center-l2"):
            y = torch.nn.functional.normalize(y.unflatten(-1, (self.blocks, -1)), dim=-1).flatten(-2)
        return y

    def save(self, path) -> None:
        tensors = {"center": self.center.detach().cpu().contiguous(), "scale": self.scale.detach().cpu().contiguous()}
        atomic_write_bytes(path, save(tensors, metadata={"kind": self.kind, "blocks": str(self.blocks)}))

    @classmethod
    def load(cls, path) -> "Normalizer":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        t = load_file(str(path))
        return cls(meta.get("kind", "none"), t["center"], t["scale"], int(meta.get("blocks", 1)))
