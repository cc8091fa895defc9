"""The teacher's soft targets of a distillation: for each anchor text, a candidate set and the teacher's
energies over it, made once and cached in the output folder.

- Anchors: the task's own training texts (IR: the train queries; pairs and STS tables: both columns' train
  sentences) and up to `unlabeled_anchors` texts drawn from the unlabeled rows (`--unlabeled`, or a BEIR
  task's corpus documents). Dev and test texts are never anchors.
- Candidates of an anchor: the frozen store's search (cosine over the stored features, exact top `search_k`
  of the corpus: heads.network.candidates.frozen_topk) re-scored by the teacher, its `teacher_k` lowest
  energies kept, plus `random_k` corpus texts drawn at random; the anchor's own text is never its candidate.
  A random draw that repeats a candidate is padding (`valid` False), so every set has the same width.
- Memory is bounded by the candidate sets: anchors go CHUNK at a time, and the teacher embeds only the texts
  of that chunk's candidate sets (never corpus x corpus, never the whole corpus at once).

The cache, `OUT/teacher-targets-<key>.npz`, holds store rows (not task positions) and is keyed by
everything that made it (`targets_key`: TARGETS_FORMAT, the teacher's weights, the store's fingerprint, the
arrays, the anchors and the corpus (their rows and the texts those rows hold), the settings that make targets and
the chunk size): a rerun with the same key reuses it, any change
makes another. It is written whole (a temporary `.incomplete` file, then a rename) or not at all. The teacher's
pass keeps each finished chunk of anchors in `OUT/teacher-targets-<key>.parts/` (each written whole), so a pass
killed part way goes on from its last finished chunk; the random candidates of a chunk are drawn from a stream
of (sample_seed, chunk), so a resumed pass gives the same targets as one never stopped. The parts go once the
whole file is written.
"""
from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from headstore.data.files import atomic_write_bytes
from headstore.data.progress import progress_bar, progress_write
from headstore.heads.kinds import held_out_rows
from headstore.heads.network.candidates import frozen_topk
from headstore.heads.scoring.energy import candidate_energy

# the recipe version of the targets (data/keys.py's rule): bumped when the numbers they hold change. 2: random
# candidates drawn per chunk (resumable pass)
TARGETS_FORMAT = "headstore.distill-targets/2"
CHUNK = 256  # anchors scored at a time: 256 x (search_k + random_k) teacher energies, the chunk's texts embedded
EMBED_BATCH = 8192  # texts per teacher forward pass


@dataclass(frozen=True)
class Targets:
    """anchors (U,), candidates (U, C): rows (store rows in the cache, task positions in training); energies
    (U, C) float32, the teacher's; valid (U, C) bool (False: padding); embeddings (U, d) float32, the teacher's
    outputs of the anchors, where a loss reads them (never cached: a head's forward pass over U texts)."""

    anchors: np.ndarray
    candidates: np.ndarray
    energies: np.ndarray
    valid: np.ndarray
    embeddings: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.anchors)

    def mapped(self, fn) -> "Targets":
        """The same targets with every row passed through `fn` (store rows <-> task positions)."""
        return Targets(fn(self.anchors), fn(self.candidates), self.energies, self.valid, self.embeddings)

    def with_embeddings(self, embeddings: np.ndarray) -> "Targets":
        assert len(embeddings) == len(self.anchors)
        return Targets(self.anchors, self.candidates, self.energies, self.valid, embeddings.astype(np.float32))


def anchor_and_corpus_rows(task, n_unlabeled: int, seed: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """(anchor store rows, candidate corpus store rows, what they are in words and counts)."""
    train = task.train
    if train is None or task.kind not in ("ir", "sts", "pairs"):
        raise ValueError(f"{task.name}: distillation needs a ranking or similarity task with training pairs (a BEIR "
                         f"folder, a pairs or STS table); this is a {task.kind!r} task")
    own = np.unique(train.anchor if task.corpus_rows is not None else np.concatenate([train.anchor, train.positive]))
    pool = task.unlabeled.rows if task.unlabeled is not None else (
        task.corpus_rows if task.corpus_rows is not None else np.zeros(0, np.int64))
    pool = np.setdiff1d(np.asarray(pool, dtype=np.int64), own)
    held_out = np.intersect1d(pool, held_out_rows(task))  # a dev or test item's text (IR: a query; the corpus stays)
    pool = np.setdiff1d(pool, held_out)
    rng = np.random.default_rng(seed)
    drawn = np.sort(rng.choice(pool, size=min(n_unlabeled, len(pool)), replace=False)) if len(pool) else pool
    corpus = task.corpus_rows if task.corpus_rows is not None else np.unique(
        np.concatenate([train.anchor, train.positive, pool]))
    corpus = np.asarray(corpus, dtype=np.int64)
    if len(corpus) < 3:
        raise ValueError(f"{task.name}: {len(corpus)} candidate texts; a distillation needs a few (add --unlabeled)")
    source = "the unlabeled texts" if task.unlabeled is not None else (
        "the corpus documents" if task.corpus_rows is not None else "none")
    report = {"task_anchors": int(len(own)), "unlabeled_anchors": int(len(drawn)), "unlabeled_from": source,
              "unlabeled_available": int(len(pool)), "unlabeled_held_out": int(len(held_out)),
              "corpus": int(len(corpus))}
    return np.concatenate([own, drawn]), corpus, report


def rows_digest(rows: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(rows, dtype=np.int64).tobytes()).hexdigest()


def targets_key(teacher_key: str, store, arrays: tuple[str, str], anchors: np.ndarray, corpus: np.ndarray,
                settings: dict) -> str:
    """sha256 of everything that makes the targets (module doc): of `store` (a FeatureStore) its fingerprint and
    the text ids of the anchor and corpus rows (the texts those rows stand for, not only their row numbers)."""
    text_ids = store.texts["text_id"].to_numpy()[np.concatenate([anchors, corpus])]
    texts = hashlib.sha256("\n".join(map(str, text_ids)).encode()).hexdigest()
    parts = {"format": TARGETS_FORMAT, "teacher": teacher_key, "store": store.fingerprint, "arrays": list(arrays),
             "anchors": rows_digest(anchors), "corpus": rows_digest(corpus), "texts": texts, "settings": settings,
             "chunk": CHUNK}  # the random candidates' stream is drawn per chunk
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def targets_path(out: Path, key: str) -> Path:
    return Path(out) / f"teacher-targets-{key[:16]}.npz"


def parts_path(out: Path, key: str, positions_of: np.ndarray | None) -> Path:
    """The folder of a pass's finished chunks: keyed as the targets and by the rows its positions stand for."""
    rows = "all" if positions_of is None else rows_digest(positions_of)[:8]
    return Path(out) / f"teacher-targets-{key[:16]}-{rows}.parts"


def read_targets(path: Path, key: str) -> Targets | None:
    """The cached targets at `path` if they are whole and of `key`; None when absent."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["key"]) != key:
                return None
            return Targets(z["anchors"], z["candidates"], z["energies"], z["valid"])
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path}: damaged teacher targets ({type(e).__name__}: {str(e)[:120]}) (delete the file: "
                         "the same command then makes them again)") from None


def write_targets(path: Path, key: str, targets: Targets) -> None:
    buf = io.BytesIO()
    np.savez(buf, key=np.asarray(key), anchors=targets.anchors, candidates=targets.candidates,
             energies=targets.energies, valid=targets.valid)
    atomic_write_bytes(path, buf.getvalue())


class HeadTeacher:
    """A head or ensemble (heads.artefacts.head.Head) scoring stored features: `features` (n, D) raw, at the
    task's positions, on the device the head is on."""

    def __init__(self, head, features: torch.Tensor):
        self.head, self.features = head, features

    def embed(self, positions: np.ndarray, role: str) -> torch.Tensor:
        x = self.features[torch.as_tensor(positions, device=self.features.device)]
        with torch.no_grad():
            parts = [self.head.model.encode(self.head.normalizer(x[s:s + EMBED_BATCH]), role)[0]
                     for s in range(0, len(x), EMBED_BATCH)]
        return torch.cat(parts).float()

    def energies(self, anchors: np.ndarray, candidates: np.ndarray) -> torch.Tensor:
        """(b,), (b, c) positions -> (b, c) the teacher's energies."""
        docs, inverse = np.unique(candidates, return_inverse=True)
        za, zd = self.embed(anchors, "query"), self.embed(docs, "document")
        zc = zd[torch.as_tensor(inverse.reshape(candidates.shape), device=zd.device)]  # (b, c, d)
        return candidate_energy(self.head.energy_name, za, zc).cpu()


def make_targets(teacher, search_features: torch.Tensor, anchors: np.ndarray, corpus: np.ndarray, settings: dict,
                 progress: bool = True, parts_dir: Path | None = None) -> Targets:
    """Targets of `anchors` over `corpus` (task positions; module doc). `search_features`: the frozen features the
    candidate search ranks by cosine; `settings`: DistillConfig.target_settings(); `parts_dir`: where finished
    chunks are kept (a rerun reuses them; the caller keys the folder by everything that made them)."""
    parts, reused = [], 0
    bar = progress_bar(total=len(anchors), desc="teacher targets (texts)", disable=not progress, leave=False)
    for i, start in enumerate(range(0, len(anchors), CHUNK)):
        a = anchors[start:start + CHUNK]
        part = None if parts_dir is None else Path(parts_dir) / f"chunk-{i:06d}-{len(a)}.npz"
        if part is not None and part.is_file():
            with np.load(part) as z:
                parts.append((z["candidates"], z["energies"], z["valid"]))
            reused += len(a)
        else:
            parts.append(_chunk(teacher, search_features, a, corpus, settings, i))
            if part is not None:
                buf = io.BytesIO()
                np.savez(buf, candidates=parts[-1][0], energies=parts[-1][1], valid=parts[-1][2])
                part.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(part, buf.getvalue())
        bar.update(len(a))
    bar.close()
    if reused:
        progress_write(f"teacher targets: {reused} of {len(anchors)} anchors' targets reused from {parts_dir} "
                       "(an earlier pass stopped part way)")
    cands, energies, valid = (np.concatenate(x) for x in zip(*parts))
    return Targets(anchors, cands, np.where(valid, energies, 0.0).astype(np.float32), valid)


def _chunk(teacher, search_features, a: np.ndarray, corpus: np.ndarray, settings: dict, index: int):
    """(candidates, energies, valid) of the anchors `a`, chunk `index` of the pass (its own random stream)."""
    k, r, s = settings["teacher_k"], settings["random_k"], settings["search_k"]
    rng = np.random.default_rng([settings["sample_seed"] + 1, index])
    pool = corpus[frozen_topk(search_features, a, corpus, s + 1)]  # (b, s + 1): room for the anchor itself
    E = teacher.energies(a, pool).masked_fill_(torch.as_tensor(pool == a[:, None]), torch.inf)
    kk = min(k, pool.shape[1] - 1)
    top = torch.topk(E, kk, dim=1, largest=False, sorted=True)
    top_rows = np.take_along_axis(pool, top.indices.numpy(), axis=1)
    rand = corpus[rng.integers(0, len(corpus), size=(len(a), r))]
    rand_E = teacher.energies(a, rand) if r else torch.zeros(len(a), 0)
    cand = np.concatenate([top_rows, rand], axis=1)
    energies = torch.cat([top.values, rand_E], dim=1).numpy().astype(np.float32)
    return cand, energies, _valid(cand, a, np.isfinite(energies))


def _valid(cand: np.ndarray, anchors: np.ndarray, finite: np.ndarray) -> np.ndarray:
    """(b, C) bool: a slot is padding where it is the anchor itself, not finite, or repeats an earlier slot."""
    order = np.argsort(cand, axis=1, kind="stable")
    sorted_ = np.take_along_axis(cand, order, axis=1)
    repeat_sorted = np.zeros_like(sorted_, dtype=bool)
    repeat_sorted[:, 1:] = sorted_[:, 1:] == sorted_[:, :-1]  # the later slot of a pair of equal rows
    repeat = np.zeros_like(repeat_sorted)
    np.put_along_axis(repeat, order, repeat_sorted, axis=1)
    valid = finite & ~repeat & (cand != anchors[:, None])
    return valid
