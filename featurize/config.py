"""The settings of one featurize run, as a small frozen dataclass of plain values.

The parts that change the stored numbers (model, pooling, layers, max length, dtype) go into the
store's fingerprint; the rest (batch size, device, commit period) only change speed.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

DTYPES = ("float16", "float32")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class FeaturizeConfig:
    # `minilm` (the offline all-MiniLM-L6-v2), a local HF model dir, or a Hub id.
    model: str = "minilm"
    # mean pooling is what sentence-transformers models such as MiniLM were trained with.
    pooling: str = "mean"
    # hidden-state layers to store; -1 (the last) is what every head uses by default.
    layers: tuple[int, ...] = (-1,)
    # None: the model's own (sentence_bert_config max_seq_length, else tokenizer max up to 512).
    max_length: int | None = None
    # float16 halves the store and the heads' memory; its ~1e-3 relative error is far below
    # what heads can resolve. float32 for exact comparisons.
    dtype: str = "float16"
    # padded tokens per forward batch: ~16k keeps CPU caches busy without huge activations;
    # GPUs want more (65536 on an H100).
    batch_tokens: int = 16384
    # upper bound on texts per batch, so a corpus of very short texts does not form huge batches.
    max_batch_size: int = 1024
    # auto: cuda when available, else cpu.
    device: str = "auto"
    # commit (atomically rewrite texts.parquet) at most this often: bounds the work lost to a
    # crash while keeping the rewrite cost negligible for large corpora. 0 = after every batch.
    commit_seconds: float = 30.0
    # rows per zarr chunk and per shard file: 256-row chunks read fast for row subsets; 64k-row
    # shards keep the file count low (one file per 64k texts).
    chunk_rows: int = 256
    shard_rows: int = 65536
    # CPU threads for torch; 0 = all cores.
    num_threads: int = 0

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} not valid; choose one of {list(DTYPES)}")
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r} not valid; choose one of {list(DEVICES)}")
        from featurize.pooling import POOLINGS

        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling {self.pooling!r} not valid; choose one of {sorted(POOLINGS)}")
        if not self.layers or len(set(self.layers)) != len(self.layers):
            raise ValueError(f"layers must be a non-empty list of distinct ints, got {self.layers}")
        if self.max_length is not None and self.max_length < 2:
            raise ValueError(f"max_length must be >= 2 (room for [CLS] and [SEP]), got {self.max_length}")
        if self.batch_tokens < 1 or self.max_batch_size < 1:
            raise ValueError("batch_tokens and max_batch_size must be positive")
        if self.shard_rows % self.chunk_rows:
            raise ValueError(f"shard_rows ({self.shard_rows}) must be a multiple of chunk_rows ({self.chunk_rows})")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)


def parse_layers(text: str) -> tuple[int, ...]:
    """'-1,-4' -> (-1, -4); a clear ValueError for anything else."""
    try:
        layers = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"layers must be comma-separated ints such as -1,-4; got {text!r}") from None
    if not layers:
        raise ValueError(f"layers must name at least one layer; got {text!r}")
    return layers
