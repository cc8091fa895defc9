"""A tuned-encoder teacher for `cli distill`: the output of `cli finetune` (its folder, or its head/ folder; a
compare step's finetune output alike), whose scores come from the tuned encoder's own store of the same texts.

    cli distill --store S --data D --teacher runs/finetuned --teacher-store runs/store-tuned --out H

The teacher's head was trained over the tuned encoder's features (its config names that encoder, `encoder_dir`,
and that store's fingerprint). Every text the distillation scores (the task's texts, anchors, candidates, the
--transfer sets) is looked up in the teacher's store by its text id (the student store's row ids: the same texts
and prompts); texts it lacks are encoded with the tuned encoder into it first (`featurize_texts`, the teacher
store's own settings, or for a new one every fingerprint setting of the store the teacher head was trained on (its
layers, length, dtype, precision, numerics, runtime: `manifest_settings`), the tuned encoder as the model), said on
the terminal with how many texts, tokens and an estimated time before it starts. The teacher's
store defaults to `<finetune folder>/store-<its fingerprint's first 12>`: keyed by what made it (the encoder's
weights and the numerics).
Refused in one line: a teacher store of another fingerprint, a store with prompts (its ids are per role), and
settings that would make a store of another fingerprint than the teacher head's (checked before any text is
encoded: nothing is written, so no bad store is left at the default path).
"""
from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import torch

from headstore.data.progress import progress_write
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.encoder.hardware import measure_matmuls
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.artefacts.head import Head


def tuned_head_dir(ref: str) -> Path | None:
    """The head folder of a tuned-encoder teacher `ref` (a finetune output or its head/), else None."""
    p = Path(ref)
    for d in (p / "head", p):
        cfg = d / "config.json"
        if cfg.is_file() and json.loads(cfg.read_text()).get("encoder_dir"):
            return d
    return None


def default_teacher_store(head: Head) -> Path:
    """<the finetune folder>/store-<fingerprint[:12]> (module doc)."""
    return Path(head.config["encoder_dir"]).parent / f"store-{head.store_fingerprint[:12]}"


def manifest_settings(parts: dict) -> dict:
    """The FeaturizeConfig settings that remake a store's fingerprint parts `parts` (a manifest's)."""
    numerics = parts.get("numerics")
    precision = {"bf16-weights": "bf16-weights", "fp16-weights": "fp16"}.get(numerics) or \
        {"bf16": "bf16-autocast"}.get(parts.get("precision"), parts.get("precision", "fp32"))
    return {"layers": tuple(parts.get("layers", (-1,))), "max_length": parts.get("max_length"),
            "dtype": parts["dtype"], "precision": precision, "backend": parts.get("backend", "torch")}


def featurize_config(store: FeatureStore, head: Head, teacher_store: FeatureStore | None) -> FeaturizeConfig:
    """The settings the teacher store's missing texts are encoded with: its own (its config.json) where it exists,
    else every fingerprint setting of the store the teacher's head was trained on (`manifest_settings`; the
    student store's would make another fingerprint wherever its layers, dtype or precision differ) and the
    student store's for the rest (batches, threads), the tuned encoder as the model either way."""
    saved = json.loads((Path((teacher_store or store).path) / "config.json").read_text())
    names = {f.name for f in fields(FeaturizeConfig)}
    cfg = replace(FeaturizeConfig(**{k: v for k, v in saved.items() if k in names}),
                  model=str(head.config["encoder_dir"]))
    return cfg if teacher_store is not None else replace(cfg, **manifest_settings(head.store_manifest))


def check_planned(cfg: FeaturizeConfig, head: Head, path: Path) -> None:
    """ValueError, before any text is encoded, where `cfg` would make a store of another fingerprint than the one
    the teacher head was trained on, naming the parts that differ."""
    from headstore.featurize.encoder.resolved import resolve
    from headstore.featurize.store.layout import fingerprint_of

    parts = resolve(cfg).parts()
    if fingerprint_of(parts) == head.store_fingerprint:
        return
    want = head.store_manifest
    diff = ", ".join(f"{k} {parts[k]!r} vs {want.get(k)!r}" for k in sorted(parts) if parts[k] != want.get(k)) \
        or "parts hash differently"
    raise ValueError(f"teacher store {path}: the tuned encoder {cfg.model} would give features of another "
                     f"fingerprint than {head.source} was trained on ({diff}); nothing encoded: featurize its store "
                     "with finetune.json's suggested command and give it with --teacher-store")


def estimated_seconds(encoder_dir: str, tokens: int, precision: str) -> float:
    """~2 x parameters x tokens over this CPU's measured matmul rate (featurize.encoder.hardware): a forward pass's FLOPs."""
    size = sum(f.stat().st_size for f in Path(encoder_dir).glob("*.safetensors"))
    params = size / 4  # fp32 weights
    rate = measure_matmuls()["bf16_gflops" if precision.startswith("bf16") else "fp32_gflops"] * 1e9
    return 2 * params * tokens / max(rate, 1.0)


class TunedTeacherStore:
    """The tuned encoder's store, read at the student store's rows (module doc)."""

    def __init__(self, head: Head, store: FeatureStore, path: str | Path | None):
        self.head, self.store = head, store
        self.path = Path(path) if path else default_teacher_store(head)
        if store.prompts and any(store.prompts.values()):
            raise ValueError(f"{store.path} has prompts ({store.prompts}): a tuned teacher's store is matched by text "
                             "id per role; featurize it with finetune.json's suggested command and give a head teacher")
        self.teacher_store = self._open() if (self.path / "manifest.json").is_file() else None
        if self.teacher_store is None:  # to be made: checked now, before the distillation's work
            check_planned(featurize_config(store, head, None), head, self.path)

    def _open(self) -> FeatureStore:
        ts = FeatureStore.open(self.path)
        if ts.fingerprint != self.head.store_fingerprint:
            raise ValueError(f"--teacher-store {self.path}: fingerprint {ts.fingerprint[:12]} is not the tuned "
                             f"encoder's ({self.head.store_fingerprint[:12]}): give the store featurized with "
                             f"{self.head.config['encoder_dir']}")
        return ts

    def ensure(self, rows: np.ndarray) -> FeatureStore:
        """The teacher store holding every text of the student store's `rows` (encoding the missing ones first)."""
        texts = self.store.texts
        ids = texts["text_id"].to_numpy()[rows]
        found = self.teacher_store.find_rows(ids) if self.teacher_store is not None else np.full(len(rows), -1)
        missing = rows[found < 0]
        if len(missing):
            cfg = featurize_config(self.store, self.head, self.teacher_store)
            tokens = int(texts["n_tokens"].to_numpy()[missing].sum())
            progress_write(f"teacher store {self.path}: {len(missing):,} of the {len(rows):,} texts the teacher scores "
                           f"are not in it ({tokens:,} tokens): encoding them with the tuned encoder "
                           f"{cfg.model} (about {estimated_seconds(cfg.model, tokens, cfg.precision):.0f} s on this "
                           "CPU, estimated from its matmul rate)")
            featurize_texts(cfg, texts["text"].to_numpy()[missing].tolist(), self.path)
            self.teacher_store = self._open()
        return self.teacher_store

    def read(self, rows: np.ndarray | None, array: str) -> torch.Tensor:
        """(n, D) the tuned encoder's features of the student store's `rows` (None: every row)."""
        rows = np.arange(self.store.n_texts) if rows is None else np.asarray(rows, dtype=np.int64)
        ts = self.ensure(rows)
        trows = ts.rows_for(self.store.texts["text_id"].to_numpy()[rows])
        return torch.as_tensor(np.asarray(ts.features(trows, array), dtype=np.float32))
