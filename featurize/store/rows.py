"""Reading a store array's rows: span by span, into one float32 matrix (reader.py reads through here)."""
from __future__ import annotations

import numpy as np


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm in place (float32): the model's final Normalize, applied on read."""
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return x


READ_SPAN = 1 << 14  # rows decoded at a time: a read holds its output and one span (6 MB of float16 at D = 384, and
# its float32 copies); 1 << 16 added ~0.35 GB of transients to reading 1M rows


def read_rows(arr, rows: np.ndarray, n: int, normalize: bool) -> np.ndarray:
    """(len(rows), D) float32 of sorted unique `rows` of a Zarr array: runs of consecutive chunks holding them,
    at most READ_SPAN rows each, decoded one at a time (only chunks holding a wanted row are read; zarr's
    orthogonal selection over many rows took 1.7 GB and 3.7 s for 100k rows of 384). `normalize`: L2 rows (the
    model's final Normalize, featurize.encoder.sentence), span by span."""
    out = np.empty((len(rows), arr.shape[1]), dtype=np.float32)
    if not len(rows):
        return out
    chunk = int(arr.chunks[0])
    cids = rows // chunk
    run = np.concatenate([[0], np.cumsum(np.diff(cids) > 1)])  # runs of consecutive chunks
    first = cids[np.searchsorted(run, run)]  # the first chunk of each row's run
    key = run * (n // chunk + 2) + (cids - first) // max(1, READ_SPAN // chunk)
    starts = np.flatnonzero(np.concatenate([[True], np.diff(key) != 0]))
    for a, b in zip(starts, np.append(starts[1:], len(rows))):
        r0, r1 = int(cids[a]) * chunk, min(n, (int(cids[b - 1]) + 1) * chunk)
        block = np.asarray(arr[r0:r1])[rows[a:b] - r0].astype(np.float32)
        out[a:b] = unit_rows(block) if normalize else block
    return out
