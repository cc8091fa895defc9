"""What a featurize run needs before it reads any input: its settings resolved once (featurize.encoder.resolved),
the fingerprint parts, the ids already stored (`Plan`); the store is opened for writing (`Plan.open_writer`) only
at the first new text."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import polars as pl

from headstore.data.files import atomic_write_text
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.encoder.hardware import warn_if_emulated_bf16
from headstore.featurize.encoder.resolved import ResolvedSettings, resolve
from headstore.featurize.store.ids import IdSet, digests, first_occurrences, keys_of_digests, keys_of_hex
from headstore.featurize.store.layout import MANIFEST, StoreError, check_fingerprint, segment_backends
from headstore.featurize.store.reader import FeatureStore, stored_ids
from headstore.featurize.store.writer import StoreWriter


@dataclass
class Plan:
    """What a run needs before reading any input: its settings resolved (featurize.encoder.resolved), the
    fingerprint, the stored ids."""

    settings: ResolvedSettings  # every setting, resolved once (the rooms below read these, never the config)
    options_json: str  # the options as given, saved beside the store (config.json) once the run added rows
    store_path: Path
    parts: dict  # the fingerprint parts (settings.parts())
    stored: IdSet  # committed ids when the run began (marks count the ones the input holds)
    n_stored: int  # committed rows when the run began
    added: IdSet = field(default_factory=IdSet)  # ids queued for encoding by this run
    writer: StoreWriter | None = None  # opened by open_writer, at the first new text (never if none)

    @classmethod
    def make(cls, config: FeaturizeConfig, store_path: str | Path, device: str | None = None) -> "Plan":
        """The run's door: `config` resolved on `device` (None: config.device), the store checked against it."""
        store_path = Path(store_path)
        settings = resolve(config, device)  # refuses options that cannot run
        parts = settings.parts()
        warn_if_emulated_bf16(settings.precision, settings.device)  # one line on stderr where bf16 is emulated
        if store_path.exists() and (not store_path.is_dir() or (
                any(store_path.iterdir()) and not (store_path / MANIFEST).is_file())):
            raise StoreError(f"{store_path}: exists and is not a feature store (no {MANIFEST}); "
                             "give a new or an existing store path")
        stored, n_stored = IdSet(), 0
        if (store_path / MANIFEST).is_file():
            store = FeatureStore.open(store_path)
            check_fingerprint(store_path, store.manifest, parts)
            stored, n_stored = stored_ids(store), store.n_texts
        options = replace(config, batch_tokens=settings.batch_tokens)  # as given, with the batch budget used
        return cls(settings, options.to_json(), store_path, parts, stored, n_stored)

    def prompt(self, role: str) -> str:
        """The prompt texts of `role` are encoded under ("" for a store without prompts)."""
        return self.settings.prompts.get(role, "")

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
        settings = self.settings
        writer = self.writer = StoreWriter.open_or_create(self.store_path, self.parts, dim=settings.dim,
                                                          chunk_rows=settings.chunk_rows,
                                                          shard_rows=settings.shard_rows)
        writer.provenance = {"backend": settings.backend}  # the local engine puts auto's choice here (run_local)
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
        atomic_write_text(self.store_path / "config.json", self.options_json)

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
                "n_truncated_in_store": n_truncated, "seconds": round(time.perf_counter() - t0, 3)}
