"""Compact sets of text ids: 16 bytes per id as two uint64 keys, in sorted runs.

A text id is the first 16 bytes of blake2b(text) (`headstore.data.text_id`), stored in parquet as 32
hex characters. In memory a set of N ids costs 16 N bytes (24 N with a row payload), against ~100 N
for a Python set of strings: the ids of 100 M texts fit in 1.6 GB. Lookups are binary searches on
the high 64 bits (`np.searchsorted`), confirmed on the low 64 bits.

`IdSet` grows by whole sorted runs (one per featurize window) and merges runs of similar size (a
log-structured merge): adding N ids in windows costs O(N log N) in total, a lookup O(log^2 N), and
no run is rebuilt in proportion to the store on every window; runs stop growing at MAX_RUN ids, so a
merge never needs memory in proportion to the whole set.
"""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl

from headstore.data.text_id import TEXT_ID_BYTES

# ids per run at most (4 M = 64 MB): the largest merge then needs ~200 MB on top of the set, and 100 M
# ids cost 1.6 GB in 25 runs (a lookup searches each run: ~0.3 s per 256k-text window at 100 M)
MAX_RUN = 1 << 22


def digests(texts: list[str], prompt: str = "") -> list[bytes]:
    """The 16-byte row ids (raw bytes) of texts encoded under `prompt`; `.hex()` of each is
    `row_id(text, prompt)` (`text_id(text)` without a prompt)."""
    if prompt:
        key = hashlib.blake2b(prompt.encode("utf-8")).digest()
        return [hashlib.blake2b(t.encode("utf-8"), key=key).digest()[:TEXT_ID_BYTES] for t in texts]
    blake2b = hashlib.blake2b
    return [blake2b(t.encode("utf-8")).digest()[:TEXT_ID_BYTES] for t in texts]


def keys_of_digests(raw: list[bytes]) -> np.ndarray:
    """(N, 2) uint64 keys (big-endian halves of each 16-byte id)."""
    return np.frombuffer(b"".join(raw), dtype=">u8").astype(np.uint64).reshape(-1, 2)


def keys_of_hex(hex_ids: pl.Series | list[str]) -> np.ndarray:
    """(N, 2) uint64 keys of 32-hex-character text ids."""
    if isinstance(hex_ids, pl.Series):
        joined = hex_ids.str.join("").item() if hex_ids.len() else ""
    else:
        joined = "".join(hex_ids)
    return np.frombuffer(bytes.fromhex(joined), dtype=">u8").astype(np.uint64).reshape(-1, 2)


class SortedIds:
    """One sorted run of keys (by high, then low word), with an optional int64 payload (rows)."""

    def __init__(self, keys: np.ndarray, values: np.ndarray | None = None, presorted: bool = False):
        if not presorted and len(keys):
            order = np.lexsort((keys[:, 1], keys[:, 0]))
            keys = keys[order]
            values = values[order] if values is not None else None
        self.hi = np.ascontiguousarray(keys[:, 0])  # (N,) uint64
        self.lo = np.ascontiguousarray(keys[:, 1])
        self.values = values
        self.seen: np.ndarray | None = None  # (N,) bool, set by IdSet.mark

    def __len__(self) -> int:
        return len(self.hi)

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Position of each key in this run, -1 where absent. keys (Q, 2)."""
        q_hi, q_lo = keys[:, 0], keys[:, 1]
        pos = np.searchsorted(self.hi, q_hi, side="left")
        found = np.full(len(keys), -1, dtype=np.int64)
        if not len(self.hi):
            return found
        inside = pos < len(self.hi)
        p = np.where(inside, pos, 0)
        hit = inside & (self.hi[p] == q_hi)
        exact = hit & (self.lo[p] == q_lo)
        found[exact] = p[exact]
        # equal high words (about one pair in 10^11 at 100 M ids): scan that run of equal highs
        for i in np.flatnonzero(hit & ~exact):
            j = int(p[i]) + 1
            while j < len(self.hi) and self.hi[j] == q_hi[i]:
                if self.lo[j] == q_lo[i]:
                    found[i] = j
                    break
                j += 1
        return found

    def keys(self) -> np.ndarray:
        return np.stack([self.hi, self.lo], axis=1)


def merge(a: SortedIds, b: SortedIds) -> SortedIds:
    """One sorted run of both (transient memory ~3x the merged run's 16 bytes per id)."""
    hi = np.concatenate([a.hi, b.hi])
    lo = np.concatenate([a.lo, b.lo])
    order = np.lexsort((lo, hi))
    values = (np.concatenate([a.values, b.values])[order]
              if a.values is not None and b.values is not None else None)
    merged = SortedIds(np.zeros((0, 2), dtype=np.uint64), presorted=True)
    merged.hi, merged.lo, merged.values = hi[order], lo[order], values
    return merged


class IdSet:
    """A growing set of text ids: sorted runs, merged while the newer run is at least half the older."""

    def __init__(self):
        self.runs: list[SortedIds] = []

    def __len__(self) -> int:
        return sum(len(r) for r in self.runs)

    def add(self, keys: np.ndarray) -> None:
        if not len(keys):
            return
        self.runs.append(SortedIds(keys))
        while (len(self.runs) > 1 and 2 * len(self.runs[-1]) >= len(self.runs[-2])
               and len(self.runs[-1]) + len(self.runs[-2]) <= MAX_RUN):
            last = self.runs.pop()
            self.runs[-1] = merge(self.runs[-1], last)

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """(Q,) bool: which keys are in the set."""
        out = np.zeros(len(keys), dtype=bool)
        for run in self.runs:
            out |= run.find(keys) >= 0
        return out

    def mark(self, keys: np.ndarray) -> np.ndarray:
        """`contains`, also remembering which stored ids were asked for (1 byte per id; for a set
        that is no longer added to)."""
        out = np.zeros(len(keys), dtype=bool)
        for run in self.runs:
            found = run.find(keys)
            if run.seen is None:
                run.seen = np.zeros(len(run), dtype=bool)
            run.seen[found[found >= 0]] = True
            out |= found >= 0
        return out

    def n_marked(self) -> int:
        """Distinct ids `mark` has found."""
        return int(sum(run.seen.sum() for run in self.runs if run.seen is not None))


def first_occurrences(keys: np.ndarray) -> np.ndarray:
    """Indices of the first occurrence of each distinct key, in input order."""
    if not len(keys):
        return np.zeros(0, dtype=np.int64)
    _, first = np.unique(keys, axis=0, return_index=True)
    return np.sort(first)
