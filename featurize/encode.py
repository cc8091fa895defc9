"""Tokenise, plan length-sorted token-budget batches, and run the encoder over them.

The plan is a deterministic function of the texts still to encode: sorted by (-n_tokens, text_id)
and cut greedily by the token budget. Committed rows are always a prefix of that order, so a run
resumed after a crash plans exactly the batches an uninterrupted run would have run next.
Tokenisation happens once up front (the fast tokenizer is parallel and needs the lengths to sort);
padding/pinning the next batches runs in a background thread, writing in another (see run.py).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from featurize.pooling import POOLINGS

# bump when the encoding logic changes the numbers stored (pooling maths, truncation, dtypes)
CODE_VERSION = 1


@dataclass
class Tokenized:
    ids: list[np.ndarray]  # per text, int32 token ids after truncation (incl. special tokens)
    n_tokens: np.ndarray  # (N,) int32 tokens encoded
    truncated: np.ndarray  # (N,) bool: the text had more than max_length tokens


def tokenize(tokenizer, texts: list[str], max_length: int, chunk: int = 4096) -> Tokenized:
    """Token ids with truncation at max_length, recording which texts were cut."""
    ids, truncated = [], []
    if getattr(tokenizer, "is_fast", False):
        backend = tokenizer.backend_tokenizer.__class__.from_str(tokenizer.backend_tokenizer.to_str())
        backend.no_padding()
        backend.enable_truncation(max_length)
        for start in range(0, len(texts), chunk):
            for enc in backend.encode_batch(texts[start:start + chunk], add_special_tokens=True):
                ids.append(np.asarray(enc.ids, dtype=np.int32))
                truncated.append(bool(enc.overflowing))
    else:  # slow tokenizer: tokenize untruncated, then ask it to truncate the long ones
        for text in texts:
            full = tokenizer(text, add_special_tokens=True, truncation=False)["input_ids"]
            cut = len(full) > max_length
            if cut:
                full = tokenizer(text, add_special_tokens=True, truncation=True,
                                 max_length=max_length)["input_ids"]
            ids.append(np.asarray(full, dtype=np.int32))
            truncated.append(cut)
    n_tokens = np.fromiter((len(x) for x in ids), dtype=np.int32, count=len(ids))
    return Tokenized(ids=ids, n_tokens=n_tokens, truncated=np.asarray(truncated, dtype=bool))


def plan_batches(n_tokens: np.ndarray, text_ids: list[str], batch_tokens: int,
                 max_batch_size: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Order (longest first, ties by text_id) and [start, stop) batches over that order.

    A batch holds as many texts as fit `len(batch) * longest <= batch_tokens` (at least one).
    """
    order = np.asarray(sorted(range(len(text_ids)), key=lambda i: (-int(n_tokens[i]), text_ids[i])),
                       dtype=np.int64)
    batches, start = [], 0
    while start < len(order):
        longest = int(n_tokens[order[start]])  # longest first: the batch's padded length
        size = max(1, min(max_batch_size, batch_tokens // max(longest, 1), len(order) - start))
        batches.append((start, start + size))
        start += size
    return order, batches


@dataclass
class Batch:
    start: int  # position in the plan order = offset of its first row among the new rows
    input_ids: torch.Tensor  # (B, S) int64
    attention_mask: torch.Tensor | None  # (B, S) int64, None when no text is padded
    n_real_tokens: int


def collate(ids: list[np.ndarray], pad_id: int, pin: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    longest = max(len(x) for x in ids)
    input_ids = np.full((len(ids), longest), pad_id, dtype=np.int64)  # (B, S)
    mask = np.zeros((len(ids), longest), dtype=np.int64)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = x
        mask[i, : len(x)] = 1
    input_ids_t = torch.from_numpy(input_ids)
    mask_t = None if mask.all() else torch.from_numpy(mask)  # no mask: the fast SDPA path
    if pin:
        input_ids_t = input_ids_t.pin_memory()
        mask_t = mask_t.pin_memory() if mask_t is not None else None
    return input_ids_t, mask_t


def prefetch_batches(tok: Tokenized, order: np.ndarray, batches: list[tuple[int, int]],
                     pad_id: int, pin: bool, depth: int = 4) -> Iterator[Batch]:
    """Collate batches in a background thread, `depth` ahead of the consumer."""
    out: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def work():
        try:
            for start, stop_ in batches:
                if stop.is_set():
                    return
                ids = [tok.ids[i] for i in order[start:stop_]]
                input_ids, mask = collate(ids, pad_id, pin)
                out.put(Batch(start, input_ids, mask, int(sum(len(x) for x in ids))))
            out.put(None)
        except BaseException as err:  # re-raised in the consumer
            out.put(err)

    thread = threading.Thread(target=work, name="headstore-collate", daemon=True)
    thread.start()
    try:
        while (item := out.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


def encode_batch(encoder, batch: Batch, pooling: str, layers: tuple[int, ...]) -> list[torch.Tensor]:
    """Pooled features of one batch, one float32 (B, D) tensor per layer, on the model's device."""
    device = torch.device(encoder.device)
    cuda = device.type == "cuda"
    input_ids = batch.input_ids.to(device, non_blocking=cuda)
    mask = batch.attention_mask.to(device, non_blocking=cuda) if batch.attention_mask is not None else None
    want_hidden = tuple(layers) != (-1,)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else _nullcontext()
    with torch.inference_mode(), autocast:
        out = encoder.model(input_ids=input_ids, attention_mask=mask,
                            output_hidden_states=want_hidden, return_dict=True)
        full_mask = mask if mask is not None else torch.ones_like(input_ids)
        pool = POOLINGS[pooling]
        if want_hidden:
            return [pool(out.hidden_states[layer], full_mask) for layer in layers]
        return [pool(out.last_hidden_state, full_mask)]


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
