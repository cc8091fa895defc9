"""A document memory on disk: the judged documents' edited vectors, by store text id (docs/memory.md).

`memory.safetensors` in a head folder: one tensor `vectors` (n, d), n = the judged documents (at most the training
judgements' documents x the vector width), and metadata saying what they are keyed by: the store's fingerprint,
a digest of the training judgements, the recipe version, the space the vectors live in (`features`: the head's
inputs, before it; `outputs`: after it), the move and its strength, and each vector's store text id (the row id of
the document's text under the document prompt) and its dataset document id. A memory applies only to the store
it was fitted on (`check_store`); a document id it knows whose text is no longer the text it edited is an error
(`check_documents`), never a silent miss.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from headstore.data.files import atomic_write_bytes

MEMORY_FILE = "memory.safetensors"
RECIPE = 1  # the memory's recipe version: bumped when the same inputs would give other vectors
SPACES = ("features", "outputs")  # where it acts: on the head's inputs (before it) or its outputs (after it)


def judgements_digest(pairs: list[tuple[str, str]]) -> str:
    """sha256 of the sorted unique (query text id, document text id) training judgements: the memory's key."""
    text = "\n".join(f"{q}\t{d}" for q, d in sorted(set(pairs)))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class DocumentMemory:
    """The edited vectors of the judged documents (module doc); `vectors` (n, d) float32, row i <-> text_ids[i]."""

    text_ids: tuple[str, ...]
    doc_ids: tuple[str, ...]  # the dataset's ids of those documents (BEIR corpus `_id`), for the text check
    vectors: torch.Tensor  # (n, d)
    space: str  # SPACES
    move: str  # heads.scoring.nudge.MOVES
    gamma: float  # the strength chosen on dev (0: the memory changes nothing)
    dataset: str  # the task's name: document ids are checked only on it
    store_fingerprint: str
    judgements: str  # judgements_digest of the training judgements
    recipe: int = RECIPE

    def __post_init__(self):
        assert self.vectors.ndim == 2 and len(self.vectors) == len(self.text_ids) == len(self.doc_ids)
        assert self.space in SPACES

    def __len__(self) -> int:
        return len(self.text_ids)

    def describe(self) -> dict:
        """What metrics.json and config.json say of the memory (no vectors)."""
        return {"documents": len(self), "width": int(self.vectors.shape[1]), "space": self.space, "move": self.move,
                "gamma": self.gamma, "dataset": self.dataset, "store_fingerprint": self.store_fingerprint,
                "judgements": self.judgements, "recipe": self.recipe, "file": MEMORY_FILE}

    def save(self, path: str | Path) -> Path:
        from safetensors.torch import save
        meta = {k: json.dumps(v) for k, v in self.describe().items() if k not in ("documents", "width", "file")}
        meta.update(text_ids=json.dumps(list(self.text_ids)), doc_ids=json.dumps(list(self.doc_ids)))
        path = Path(path)
        atomic_write_bytes(path, save({"vectors": self.vectors.detach().cpu().float().contiguous()}, metadata=meta))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "DocumentMemory":
        from safetensors import SafetensorError, safe_open
        try:
            with safe_open(str(path), framework="pt") as f:
                meta, vectors = f.metadata() or {}, f.get_tensor("vectors")
            fields = {k: json.loads(meta[k]) for k in ("space", "move", "gamma", "dataset", "store_fingerprint",
                                                       "judgements", "recipe", "text_ids", "doc_ids")}
        except (SafetensorError, OSError, KeyError, ValueError) as e:
            raise ValueError(f"{path}: not a document memory ({type(e).__name__}: {e}); train the head again "
                             "(cli train-head --memory)") from None
        if fields["recipe"] != RECIPE:
            raise ValueError(f"{path}: a memory of recipe {fields['recipe']}, this headstore reads recipe {RECIPE}; "
                             "train the head again")
        fields["text_ids"], fields["doc_ids"] = tuple(fields["text_ids"]), tuple(fields["doc_ids"])
        return cls(vectors=vectors, **fields)

    def check_store(self, fingerprint: str, where: str) -> None:
        """A memory edits one store's vectors: another store (another encoder or settings) is refused."""
        if fingerprint != self.store_fingerprint:
            raise ValueError(f"{where}: the document memory was fitted on a store with fingerprint "
                             f"{self.store_fingerprint[:12]}..., this store's is {fingerprint[:12]}... (another encoder "
                             "or settings); use the store the head was trained on, or --no-memory")

    def check_documents(self, dataset: str, doc_ids, text_ids, where: str) -> None:
        """On the dataset it was fitted on, a document id it knows must still hold the text it edited."""
        if dataset != self.dataset:
            return
        mine = dict(zip(self.doc_ids, self.text_ids))
        for doc, tid in zip(doc_ids, text_ids):
            if doc in mine and mine[doc] != tid:
                raise ValueError(f"{where}: document {doc!r}'s text changed since the memory was fitted (its text id "
                                 f"is {tid}, the memory's {mine[doc]}); train the head again, or --no-memory")

    def placed(self, find_rows, positions=None) -> "PlacedMemory":
        """The memory on a task's matrix: find_rows (text ids -> store rows, -1 absent: FeatureStore.find_rows),
        positions (store rows -> matrix positions, None: the same; heads.artefacts.task_features). Documents absent
        from the store or from the matrix are left out (another dataset's texts are not edited)."""
        rows = np.asarray(find_rows(list(self.text_ids)), dtype=np.int64)
        keep = rows >= 0
        if positions is not None and keep.any():
            pos = np.full(len(rows), -1, dtype=np.int64)
            pos[keep] = positions(rows[keep])
            rows = pos
            keep = rows >= 0
        return PlacedMemory(rows[keep], self.vectors[torch.as_tensor(np.flatnonzero(keep))], self.space)


@dataclass(frozen=True)
class PlacedMemory:
    """A memory's vectors at positions of a feature matrix: what evaluation replaces, document side only."""

    positions: np.ndarray  # (m,) int64, matrix positions (any order)
    vectors: torch.Tensor  # (m, d)
    space: str

    def __len__(self) -> int:
        return len(self.positions)

    def to(self, device) -> "PlacedMemory":
        return PlacedMemory(self.positions, self.vectors.to(device), self.space)

    def replace(self, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """values (..., n, d) of matrix positions idx (n,): those the memory holds replaced by its vectors."""
        if not len(self.positions):
            return values
        order = np.argsort(self.positions, kind="stable")
        sorted_pos = self.positions[order]
        at = np.searchsorted(sorted_pos, idx.cpu().numpy())
        at = np.minimum(at, len(sorted_pos) - 1)
        hit = sorted_pos[at] == idx.cpu().numpy()
        if not hit.any():
            return values
        values = values.clone()
        src = torch.as_tensor(order[at[hit]], device=self.vectors.device)
        values[..., torch.as_tensor(np.flatnonzero(hit), device=values.device), :] = \
            self.vectors[src].to(values.device, values.dtype)
        return values


def known_texts(memory: DocumentMemory | None, text_ids, role: str | None) -> "Known | None":
    """The memory's vectors of the texts (by text id) it knows, for texts embedded as documents (None: nothing to
    replace). A text it knows embedded with no role is ambiguous (a query that is also a corpus document): an error."""
    if memory is None or text_ids is None:
        return None
    index = {t: i for i, t in enumerate(memory.text_ids)}
    at = [(j, index[t]) for j, t in enumerate(text_ids) if t in index]
    if at and role is None:
        raise ValueError(f"text {at[0][0]} is a document the head's memory edited; say role='document' (its edited "
                         "vector) or role='query' (a query is never edited)")
    if not at or role != "document":
        return None
    rows, mine = zip(*at)
    return Known(np.asarray(rows, dtype=np.int64), memory.vectors[list(mine)], memory.space)


@dataclass(frozen=True)
class Known:
    """Rows of a batch of texts the memory knows, and their vectors in its space."""

    rows: np.ndarray  # (m,) positions in the batch of texts
    vectors: torch.Tensor  # (m, d)
    space: str

    def edit(self, values: torch.Tensor, start: int, space: str) -> torch.Tensor:
        """values (b, d) of texts start .. start + b: those the memory knows replaced, where it acts in `space`."""
        if space != self.space:
            return values
        inside = (self.rows >= start) & (self.rows < start + len(values))
        if not inside.any():
            return values
        values = values.clone()
        values[torch.as_tensor(self.rows[inside] - start, device=values.device)] = \
            self.vectors[torch.as_tensor(np.flatnonzero(inside))].to(values.device, values.dtype)
        return values
