"""One featurize run: datasets -> texts not yet stored -> encoder -> committed rows of the store."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
import torch
from tqdm import tqdm

from headstore.data.text_id import text_ids as compute_text_ids
from headstore.featurize.config import FeaturizeConfig
from headstore.featurize.encode import CODE_VERSION, encode_batch, plan_batches, prefetch_batches, tokenize
from headstore.featurize.model import load_encoder, model_identity, pick_device
from headstore.data.files import atomic_write_text
from headstore.featurize.store import StoreWriter, array_names


def fingerprint_parts(config: FeaturizeConfig) -> dict:
    """The fingerprint parts of a run with this config (hashes are cached: cheap to repeat)."""
    identity = model_identity(config.model, config.max_length)
    return {"model_id": identity.model_id, "weights_hash": identity.weights_hash,
            "tokenizer_hash": identity.tokenizer_hash, "pooling": config.pooling,
            "layers": list(config.layers), "max_length": identity.max_length,
            "dtype": config.dtype, "precision": config.resolved_precision(pick_device(config.device)),
            "code_version": CODE_VERSION}


def featurize(config: FeaturizeConfig, data_paths: Sequence[str | Path], store_path: str | Path,
              formats: Sequence[str | None] | None = None) -> dict:
    """Encode every text of the datasets that the store does not hold yet; returns a summary."""
    from headstore.data.dataset import load_dataset

    formats = list(formats) if formats else [None] * len(data_paths)
    if len(formats) == 1 and len(data_paths) > 1:
        formats = formats * len(data_paths)
    if len(formats) != len(data_paths):
        raise ValueError(f"give one format for all datasets or one per dataset "
                         f"({len(data_paths)} datasets, {len(formats)} formats)")
    texts: list[str] = []
    for path, fmt in zip(data_paths, formats):
        texts.extend(load_dataset(path, format=fmt).texts())
    return featurize_texts(config, texts, store_path)


class _Committer:
    """Writer thread: writes features of finished batches, commits at most every commit_seconds."""

    def __init__(self, writer: StoreWriter, commit_seconds: float, max_pending_rows: int):
        self.writer = writer
        self.commit_seconds = commit_seconds
        self.max_pending_rows = max_pending_rows
        self.inbox: queue.Queue = queue.Queue(maxsize=64)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="headstore-writer", daemon=True)
        self.thread.start()

    def put(self, item) -> None:
        if self.error is not None:
            raise self.error
        self.inbox.put(item)

    def finish(self) -> None:
        self.inbox.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error

    def _run(self):
        pending_feats: list[dict[str, np.ndarray]] = []
        pending_rows: list[pl.DataFrame] = []
        last = time.monotonic()
        try:
            while True:
                item = self.inbox.get()
                if item is not None:
                    pending_feats.append(item[0])
                    pending_rows.append(item[1])
                n_pending = sum(r.height for r in pending_rows)
                due = (item is None or time.monotonic() - last >= self.commit_seconds
                       or n_pending >= self.max_pending_rows)
                if due and pending_rows:
                    feats = {k: np.concatenate([f[k] for f in pending_feats]) for k in pending_feats[0]}
                    self.writer.write_rows(self.writer.n_texts, feats)
                    self.writer.commit(pl.concat(pending_rows))
                    pending_feats, pending_rows, last = [], [], time.monotonic()
                if item is None:
                    return
        except BaseException as err:
            self.error = err
            while self.inbox.get() is not None:  # drain so the producer never blocks
                pass


def featurize_texts(config: FeaturizeConfig, texts: Sequence[str], store_path: str | Path) -> dict:
    """Encode the texts (deduplicated by text_id) missing from the store; a no-op if none are."""
    t0 = time.perf_counter()
    parts = fingerprint_parts(config)
    ids = compute_text_ids(list(texts))
    unique: dict[str, str] = {}
    for tid, text in zip(ids, texts):
        unique.setdefault(tid, text)
    summary = {"store": str(store_path), "n_input_texts": len(texts), "n_unique": len(unique)}
    with StoreWriter.open_or_create(store_path, parts, dim=_dim_of(config),
                                    chunk_rows=config.chunk_rows,
                                    shard_rows=config.shard_rows) as writer:
        stored = writer.text_ids()
        new_ids = [t for t in unique if t not in stored]
        summary.update(n_already_stored=len(unique) - len(new_ids), n_encoded=len(new_ids))
        if new_ids:
            summary.update(_encode_new(config, writer, new_ids, [unique[t] for t in new_ids]))
            # the settings of the latest run that added rows, beside the store (speed settings
            # may differ between runs; the parts that change numbers are in the fingerprint)
            atomic_write_text(Path(store_path) / "config.json", config.to_json())
        else:
            summary.update(n_truncated=0, real_tokens=0)
        summary.update(n_texts=writer.n_texts, fingerprint=writer.manifest["fingerprint"],
                       n_truncated_in_store=int(writer.texts["truncated"].sum()),
                       seconds=round(time.perf_counter() - t0, 3))
    return summary


def _dim_of(config: FeaturizeConfig) -> int:
    """Hidden size from config.json, without loading weights."""
    import json

    identity = model_identity(config.model, config.max_length)
    return int(json.loads((Path(identity.model_dir) / "config.json").read_text())["hidden_size"])


def _encode_new(config: FeaturizeConfig, writer: StoreWriter, new_ids: list[str],
                new_texts: list[str]) -> dict:
    device = pick_device(config.device)
    if device == "cpu":
        torch.set_num_threads(config.num_threads or os.cpu_count() or 1)
    encoder = load_encoder(config.model, device, config.max_length)
    n_layers = encoder.model.config.num_hidden_layers
    for layer in config.layers:
        if not -(n_layers + 1) <= layer <= n_layers:
            raise ValueError(f"layer {layer} out of range for a {n_layers}-layer model "
                             f"(valid {-(n_layers + 1)}..{n_layers}; 0 = embeddings, -1 = last)")
    names = list(array_names(config.layers))
    np_dtype = np.dtype(config.dtype)

    t0 = time.perf_counter()  # timing includes tokenisation (as sentence-transformers' encode does)
    tok = tokenize(encoder.tokenizer, new_texts, encoder.max_length)
    precision = config.resolved_precision(device)
    order, batches = plan_batches(tok.n_tokens, new_ids, config.batch_tokens, config.max_batch_size,
                                  batch_overhead_tokens=config.resolved_batch_overhead(device),
                                  attention_width=6 * encoder.model.config.hidden_size)
    base = writer.n_texts
    pad_id = encoder.tokenizer.pad_token_id or 0
    committer = _Committer(writer, config.commit_seconds, max_pending_rows=config.shard_rows)
    real_tokens, padded_tokens = 0, 0
    bar = tqdm(total=len(new_ids), unit="text", desc="featurize", smoothing=0.1, dynamic_ncols=True)
    try:
        # CPU: collate inline (the cores are busy with the forward); GPU: in a background thread
        depth = 4 if device == "cuda" else 0
        for batch in prefetch_batches(tok, order, batches, pad_id, pin=device == "cuda", depth=depth):
            pooled = encode_batch(encoder, batch, config.pooling, config.layers, precision)  # [(B, D)]
            feats = {name: p.to(torch.float32).cpu().numpy().astype(np_dtype, copy=False)
                     for name, p in zip(names, pooled)}
            idx = order[batch.start: batch.start + batch.input_ids.shape[0]]
            rows = pl.DataFrame({
                "text_id": [new_ids[i] for i in idx], "text": [new_texts[i] for i in idx],
                "row": np.arange(base + batch.start, base + batch.start + len(idx), dtype=np.int64),
                "n_tokens": tok.n_tokens[idx], "truncated": tok.truncated[idx]})
            committer.put((feats, rows))
            real_tokens += batch.n_real_tokens
            padded_tokens += batch.input_ids.numel()
            bar.update(len(idx))
            bar.set_postfix(tok_s=f"{real_tokens / max(time.perf_counter() - t0, 1e-9):,.0f}")
    except BaseException:
        committer.put(None)  # commit what was finished, then re-raise
        committer.thread.join()
        raise
    finally:
        bar.close()
    committer.finish()
    seconds = time.perf_counter() - t0
    n_trunc = int(tok.truncated.sum())
    if n_trunc:
        tqdm.write(f"featurize: {n_trunc} of {len(new_ids)} texts were truncated at "
                   f"{encoder.max_length} tokens (column `truncated` in texts.parquet)")
    return {"n_truncated": n_trunc, "real_tokens": int(real_tokens),
            "padded_tokens": int(padded_tokens), "precision": precision,
            "encode_seconds": round(seconds, 3), "texts_per_s": round(len(new_ids) / seconds, 1),
            "tokens_per_s": round(real_tokens / seconds, 1), "device": device,
            "max_length": encoder.max_length, "n_batches": len(batches)}
