"""Tokenise, plan length-sorted token-budget batches, and run the encoder over them.

The plan is a deterministic function of the texts still to encode: sorted by (-n_tokens, text_id)
and cut greedily by the token budget. Committed rows are always a prefix of that order, so a run
resumed after a crash plans exactly the batches an uninterrupted run would have run next.
Tokenisation happens once up front (the fast tokenizer is parallel and needs the lengths to sort);
on a GPU padding/pinning the next batches runs in a background thread, writing in another (run/committer.py).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from headstore.featurize.encoder.packed import PackedLayout, collate_packed, packed_forward
from headstore.featurize.encoder.pooling import pooled_forward

# bump when the encoding logic changes the numbers stored (pooling maths, truncation, dtypes)
CODE_VERSION = 2  # 2: cost-model batch plan (fp32 features move by ~1e-6), precision part


@dataclass
class Tokenized:
    ids: list[np.ndarray]  # per text, int32 token ids after truncation (incl. special tokens)
    n_tokens: np.ndarray  # (N,) int32 tokens encoded
    truncated: np.ndarray  # (N,) bool: the text had more than max_length tokens
    seconds: float = 0.0  # wall time the tokenisation took


def tokenize(tokenizer, texts: list[str], max_length: int, chunk: int = 4096, threads: int = 1) -> Tokenized:
    """Token ids with truncation at max_length, recording which texts were cut. A fast tokenizer encodes
    chunks of `chunk` texts on `threads` threads (its Rust encode releases the GIL); the ids do not depend
    on either."""
    t0 = time.perf_counter()
    ids, truncated = [], []
    if getattr(tokenizer, "is_fast", False):
        backend = tokenizer.backend_tokenizer.__class__.from_str(tokenizer.backend_tokenizer.to_str())
        backend.no_padding()
        backend.enable_truncation(max_length)

        # without character offsets (tokenizers >= 0.21): the same ids and overflow, ~5% less work
        encode_batch = getattr(backend, "encode_batch_fast", backend.encode_batch)

        def encode(start: int) -> list[tuple[np.ndarray, bool]]:
            return [(np.asarray(enc.ids, dtype=np.int32), bool(enc.overflowing))
                    for enc in encode_batch(texts[start:start + chunk], add_special_tokens=True)]

        starts = range(0, len(texts), chunk)
        with ThreadPoolExecutor(max(1, threads)) as pool:
            for part in (pool.map(encode, starts) if threads > 1 and len(starts) > 1 else map(encode, starts)):
                ids.extend(x for x, _ in part)
                truncated.extend(cut for _, cut in part)
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
    return Tokenized(ids=ids, n_tokens=n_tokens, truncated=np.asarray(truncated, dtype=bool),
                     seconds=time.perf_counter() - t0)


def plan_batches(n_tokens: np.ndarray, text_ids: list[str], batch_tokens: int, max_batch_size: int,
                 batch_overhead_tokens: int = 0, attention_width: int = 0, packed: bool = False
                 ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Order (longest first, ties by text_id) and [start, stop) batches over that order.

    Every batch is a contiguous run of the order with `len(batch) * longest <= batch_tokens` (at
    least one text, at most max_batch_size). Among all such cuts it picks the one of least modelled
    encoder cost, summed over batches, in padded-token units:

        cost(B texts padded to S) = B * S * (1 + S / attention_width) + batch_overhead_tokens

    (projections and FFN are linear in S, attention adds a term in S^2 that equals them at
    S = attention_width ~ 6 * hidden size; 0 leaves attention out). The overhead of a forward call
    decides the trade-off: small, and texts of one exact length form their own unpadded batches;
    large, and batches fill the budget. Solved exactly by dynamic programming from the end of the
    order, so the plan from any batch start onwards depends only on the texts from there on: a
    resumed run (whose texts to encode are a suffix of the order) plans the same batches.

    packed: batches are unpadded (featurize.encoder.packed), so a batch holds texts while the sum of their
    lengths fits batch_tokens, and costs the sum of its texts' own costs (n * (1 + n / attention_width))
    plus the overhead: the same texts cost the same in any cut, and the plan is the fewest batches that
    fill the budget (smallest first batch among equals), resumable as above.
    """
    order = np.asarray(sorted(range(len(text_ids)), key=lambda i: (-int(n_tokens[i]), text_ids[i])),
                       dtype=np.int64)
    lengths = np.maximum(np.asarray(n_tokens, dtype=np.int64)[order], 1)  # (N,) non-increasing
    n = len(order)
    # integer costs scaled by attention_width (exact ties, the same on every run and machine)
    width = int(attention_width)
    scale = width if width > 0 else 1
    overhead = int(batch_overhead_tokens) * scale
    best = np.zeros(n + 1, dtype=np.int64)  # best[i]: least cost of encoding order[i:]
    stop_at = np.zeros(n, dtype=np.int64)  # stop_at[i]: end of the first batch of that plan
    (_plan_packed if packed else _plan_padded)(lengths, batch_tokens, max_batch_size, width, overhead, best, stop_at)
    batches, start = [], 0
    while start < n:
        batches.append((start, int(stop_at[start])))
        start = int(stop_at[start])
    return order, batches


def _plan_padded(lengths: np.ndarray, batch_tokens: int, max_batch_size: int, width: int, overhead: int,
                 best: np.ndarray, stop_at: np.ndarray) -> None:
    """plan_batches' dynamic programme for padded batches (fills best and stop_at)."""
    n = len(lengths)
    scale = width if width > 0 else 1
    sizes = np.arange(1, max(1, min(max_batch_size, n)) + 1, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        longest = int(lengths[i])
        k = max(1, min(max_batch_size, batch_tokens // longest, n - i))
        per_text = longest * (scale + longest if width > 0 else 1)
        costs = sizes[:k] * per_text + overhead + best[i + 1: i + 1 + k]
        size = int(np.argmin(costs)) + 1  # first minimum: smallest batch among equals
        best[i], stop_at[i] = costs[size - 1], i + size


def _plan_packed(lengths: np.ndarray, batch_tokens: int, max_batch_size: int, width: int, overhead: int,
                 best: np.ndarray, stop_at: np.ndarray) -> None:
    """plan_batches' dynamic programme for unpadded batches (fills best and stop_at)."""
    n = len(lengths)
    tokens = np.concatenate([[0], np.cumsum(lengths)])  # (N+1,) tokens before each position
    per_text = lengths * (width + lengths) if width > 0 else lengths
    work = np.concatenate([[0], np.cumsum(per_text)])  # (N+1,) scaled cost of the texts before each position
    for i in range(n - 1, -1, -1):
        fits = int(np.searchsorted(tokens, tokens[i] + batch_tokens, side="right")) - 1 - i  # texts within budget
        k = max(1, min(max_batch_size, fits, n - i))
        costs = work[i + 1: i + 1 + k] - work[i] + overhead + best[i + 1: i + 1 + k]
        size = int(np.argmin(costs)) + 1  # first minimum: smallest batch among equals
        best[i], stop_at[i] = costs[size - 1], i + size


@dataclass
class Batch:
    start: int  # position in the plan order = offset of its first row among the new rows
    input_ids: torch.Tensor  # (B, S) int64; packed: (1, T), the texts back to back
    attention_mask: torch.Tensor | None  # (B, S) int64, None when no text is padded (or packed)
    n_real_tokens: int
    packed: PackedLayout | None = None  # the texts' offsets and positions in a packed batch

    @property
    def n_texts(self) -> int:
        return self.input_ids.shape[0] if self.packed is None else len(self.packed.offsets) - 1

    @property
    def n_slots(self) -> int:
        """Tokens the encoder computes: B * S padded, T packed."""
        return self.input_ids.numel()


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
                     pad_id: int, pin: bool, depth: int = 4, packed: bool = False) -> Iterator[Batch]:
    """Collate batches (padded, or packed: featurize.encoder.packed), `depth` ahead of the consumer in a background
    thread (depth 0: inline).

    On a GPU the thread overlaps padding and pinning with the forward; on a CPU every core is
    already busy with the forward, so collating inline (it is cheap) costs nothing.
    """
    def make(start: int, stop_: int) -> Batch:
        ids = [tok.ids[i] for i in order[start:stop_]]
        n_real = int(sum(len(x) for x in ids))
        if packed:
            input_ids, layout = collate_packed(ids, pin)
            return Batch(start, input_ids, None, n_real, layout)
        input_ids, mask = collate(ids, pad_id, pin)
        return Batch(start, input_ids, mask, n_real)

    if depth <= 0:
        for start, stop_ in batches:
            yield make(start, stop_)
        return
    out: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def work():
        try:
            for start, stop_ in batches:
                if stop.is_set():
                    return
                out.put(make(start, stop_))
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
    finally:  # the consumer stopped (done, failed or closed): a thread blocked on a full queue must see it
        stop.set()
        while True:  # emptied, the one producer can put at most once more before it reads `stop`
            try:
                out.get_nowait()
            except queue.Empty:
                break
        thread.join(timeout=5)


def prompt_length(tokenizer, prompt: str) -> int:
    """Tokens a prompt takes at the start of prompt + text, as sentence-transformers counts them: the
    prompt tokenised alone with special tokens, less a trailing special token (0 without a prompt)."""
    if not prompt:
        return 0
    ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    return len(ids) - (1 if ids and ids[-1] in set(tokenizer.all_special_ids) else 0)


def encode_batch(encoder, batch: Batch, pooling, layers: tuple[int, ...], precision: str = "fp32",
                 prompt_lengths: torch.Tensor | None = None, taps: Sequence[tuple[str, int]] = ()) -> list[torch.Tensor]:
    """Pooled features of one batch, one float32 (B, D) tensor per layer, then one per tap of `taps`
    (featurize.encoder.taps), on the model's device. `pooling`: a pooling.Pooler (or a mode name);
    `prompt_lengths` (B,): prompt tokens per text, left out of the pooling where the model's Pooling says so.
    A packed batch goes through featurize.encoder.packed (no taps there: a run of taps is padded)."""
    if batch.packed is not None:
        assert not taps, "taps are read from padded batches (FeaturizeConfig turns packing off for them)"
        with torch.inference_mode():
            return packed_forward(encoder, batch.input_ids, batch.packed, pooling, layers,
                                  None if prompt_lengths is None or not prompt_lengths.any() else prompt_lengths)
    device = torch.device(encoder.device)
    cuda = device.type == "cuda"
    input_ids = batch.input_ids.to(device, non_blocking=cuda)
    mask = batch.attention_mask.to(device, non_blocking=cuda) if batch.attention_mask is not None else None
    with torch.inference_mode():
        return pooled_forward(encoder.model, input_ids, mask, pooling, layers, precision,
                              None if prompt_lengths is None or not prompt_lengths.any() else prompt_lengths, taps)


def features_to_host(items: Iterator[tuple[Batch, list[torch.Tensor]]], cuda: bool
                     ) -> Iterator[tuple[Batch, list[np.ndarray]]]:
    """(batch, [(B, D) pooled features on the device]) -> (batch, [(B, D) float32 arrays]). On a GPU each
    batch's features are copied into pinned memory without blocking and read one batch later (after the
    next batch's forward is queued), so the card never waits for the host to take them."""
    pending = None  # (batch, pinned host tensors, the event after their copy)
    for batch, pooled in items:
        if not cuda:
            yield batch, [p.to(torch.float32).cpu().numpy() for p in pooled]
            continue
        host = [torch.empty(p.shape, dtype=torch.float32, pin_memory=True) for p in pooled]
        for h, p in zip(host, pooled):
            h.copy_(p, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        if pending is not None:
            yield _arrived(pending)
        pending = (batch, host, event)
    if pending is not None:
        yield _arrived(pending)


def _arrived(pending) -> tuple[Batch, list[np.ndarray]]:
    batch, host, event = pending
    event.synchronize()
    return batch, [h.numpy().copy() for h in host]  # the pinned buffers go back to torch's cache at once
