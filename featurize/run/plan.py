"""What a featurize run needs before it reads any input: the checked options, the fingerprint parts, the ids
already stored (`Plan`); the store is opened for writing (`Plan.open_writer`) only at the first new text."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from headstore.data.files import atomic_write_text
from headstore.featurize.encoder.backends import backend_part, check_backend
from headstore.featurize.encoder.config import FINGERPRINTED_NUMERICS, FeaturizeConfig
from headstore.featurize.encoder.encode import CODE_VERSION
from headstore.featurize.encoder.hardware import warn_if_emulated_bf16
from headstore.featurize.encoder.model import check_options, model_identity, pick_device
from headstore.featurize.encoder.taps import tap_part
from headstore.featurize.encoder.sentence import SentenceSpec, resolve_prompts, resolve_spec, sentence_dim
from headstore.featurize.store.ids import IdSet, digests, first_occurrences, keys_of_digests, keys_of_hex
from headstore.featurize.store.layout import (MANIFEST, StoreError, bytes_per_text, check_fingerprint,
                                              segment_backends)
from headstore.featurize.store.reader import FeatureStore, stored_ids
from headstore.featurize.store.writer import StoreWriter


def fingerprint_parts(config: FeaturizeConfig, device: str | None = None) -> dict:
    """The fingerprint parts of a run with this config (hashes are cached: cheap to repeat)."""
    identity = model_identity(config.model, config.max_length)
    device = device or pick_device(config.device)
    spec = resolve_spec(config.pooling, identity.model_dir)
    prompts = resolve_prompts(identity.model_dir, config.query_prompt, config.document_prompt, config.prompt_name)
    return {"model_id": identity.model_id, "weights_hash": identity.weights_hash,
            "tokenizer_hash": identity.tokenizer_hash, **spec.parts(),
            "layers": list(config.layers), "max_length": identity.max_length,
            "dtype": config.dtype, "precision": config.resolved_precision(device),
            "code_version": CODE_VERSION,
            **({"prompts": prompts} if any(prompts.values()) else {}),  # absent: stores made before prompts
            **numerics_part(config, device), **backend_part(config.backend, config.resolved_precision(device)),
            **({"taps": tap_part(identity.model_dir)} if config.taps else {})}  # absent: a store without taps


def numerics_part(config: FeaturizeConfig, device: str) -> dict:
    """{"numerics": ...} for weights held in bf16/fp16, else {} (fp32 and bf16-autocast stores predate the
    part and keep their fingerprint). Packing is not a part: in fp32 it moves features by ~1e-7, as a
    different batch plan does (also not a part); in bf16 a packed and a padded batch differ by bf16's rounding
    in different kernels, as two batch plans' shapes already do, far inside the bf16-vs-fp32 bound (1e-2),
    while bf16-weights and bf16-autocast round different tensors (weights vs each matmul's inputs)."""
    numerics = config.resolved_numerics(device)
    return {"numerics": numerics} if numerics in FINGERPRINTED_NUMERICS else {}


@dataclass
class Plan:
    """What a run needs before reading any input: checked options, fingerprint, the stored ids."""

    config: FeaturizeConfig
    store_path: Path
    parts: dict
    dim: int
    device: str
    stored: IdSet  # committed ids when the run began (marks count the ones the input holds)
    n_stored: int  # committed rows when the run began
    added: IdSet = field(default_factory=IdSet)  # ids queued for encoding by this run
    writer: StoreWriter | None = None  # opened by open_writer, at the first new text (never if none)

    @classmethod
    def make(cls, config: FeaturizeConfig, store_path: str | Path, device: str | None = None) -> "Plan":
        store_path = Path(store_path)
        device = device or pick_device(config.device)
        _, hidden = check_options(config.model, config.max_length, config.layers)
        parts = fingerprint_parts(config, device)
        dim = sentence_dim(SentenceSpec.from_parts(parts), hidden, config.layers)
        check_backend(config.backend, device, parts["precision"], config.packing == "on")
        warn_if_emulated_bf16(parts["precision"], device)  # one line on stderr where bf16 is emulated
        if store_path.exists() and (not store_path.is_dir() or (
                any(store_path.iterdir()) and not (store_path / MANIFEST).is_file())):
            raise StoreError(f"{store_path}: exists and is not a feature store (no {MANIFEST}); "
                             "give a new or an existing store path")
        stored, n_stored = IdSet(), 0
        if (store_path / MANIFEST).is_file():
            store = FeatureStore.open(store_path)
            check_fingerprint(store_path, store.manifest, parts)
            stored, n_stored = stored_ids(store), store.n_texts
        return cls(config, store_path, parts, dim, device, stored, n_stored)

    def prompt(self, role: str) -> str:
        """The prompt texts of `role` are encoded under ("" for a store without prompts)."""
        return self.parts.get("prompts", {}).get(role, "")

    def new_in_window(self, window: list[str], prompt: str = "") -> tuple[list[str], list[str], np.ndarray]:
        """(hex row ids, texts, keys) of the window's texts (under `prompt`) neither stored nor queued."""
        raw = digests(window, prompt)
        keys = keys_of_digests(raw)
        fresh = ~(self.stored.mark(keys) | self.added.contains(keys))
        idx = np.flatnonzero(fresh)
        idx = idx[first_occurrences(keys[idx])]
        return [raw[i].hex() for i in idx], [window[i] for i in idx], keys[idx]

    def open_writer(self) -> StoreWriter:
        """Lock the store (creating it) as `self.writer`; ids another writer committed meanwhile
        join `added`."""
        config = self.config
        writer = self.writer = StoreWriter.open_or_create(self.store_path, self.parts, dim=self.dim,
                                                          chunk_rows=config.chunk_rows,
                                                          shard_rows=config.shard_rows)
        writer.provenance = {"backend": config.backend}  # the local engine puts auto's choice here (run_local)
        if writer.n_texts != self.n_stored:
            for part in writer.manifest["parts"]:
                if part["start"] >= self.n_stored:
                    frame = pl.read_parquet(self.store_path / part["path"], columns=["text_id"])
                    self.added.add(keys_of_hex(frame["text_id"]))
            self.n_stored = writer.n_texts
        return writer

    def save_config(self) -> None:
        """The settings of the latest run that added rows, beside the store (speed settings may
        differ between runs; the parts that change numbers are in the fingerprint)."""
        atomic_write_text(self.store_path / "config.json", self.config.to_json())

    def summary(self, counts: dict, t0: float) -> dict:
        store = FeatureStore.open(self.store_path) if (self.store_path / MANIFEST).is_file() else None
        n_truncated = int(store.scan_texts(["truncated"]).select(pl.col("truncated").sum())
                          .collect().item() or 0) if store else 0
        return {"store": str(self.store_path), **counts,
                "n_already_stored": self.stored.n_marked(),
                "n_unique": self.stored.n_marked() + counts["n_encoded"],
                "n_texts": store.n_texts if store else 0,
                "fingerprint": store.fingerprint if store else None,
                "rows_by_backend": segment_backends(store.manifest) if store else {},
                "bytes_per_text": bytes_per_text(store.manifest if store else {**self.parts, "dim": self.dim}),
                "n_truncated_in_store": n_truncated, "seconds": round(time.perf_counter() - t0, 3)}
