"""`cli index` / `cli search`: a head's outputs of a corpus in a FAISS index, searched with new queries.

Index directory IDX:
- `index.faiss`: the vectors. L1 heads: `METRIC_L1` (the energy itself); L2 heads: `METRIC_L2`
  (squared; energies reported as its square root); cosine heads: inner product on L2-normalised
  vectors (energy = 1 - inner product). `IndexFlat` (exact) by default; `--hnsw M` builds an
  `IndexHNSWFlat` with M links per node (approximate, for large corpora);
- `items.parquet`: per vector position: `id` (BEIR doc id, else the text_id), `text_id`, `text`, `row`;
- `index.json`: metric, energy, HNSW settings, counts, the store and dataset it came from, and the
  `document_space` its vectors lie in (`document_space`);
- `head/`: the head (`Head.save`), so `cli search` needs nothing but IDX and the encoder.

A query-side head (`--sides query`) leaves documents at their normalised stored features, so its index holds
no head output at all: `cli search --head OTHER` searches it with any other query-side head whose documents
lie in the same space (same store, array, normaliser and energy); one corpus index serves every such head.

Corpus: a BEIR folder's corpus (documents as `title + " " + text`, as they were featurized), or every
text of another dataset. Features are read from the store (only the corpus rows); the encoder is not
run. A query is encoded by a `Pipeline` (the head's own encoder, checked against its store).
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from headstore.data.progress import progress_bar
from headstore.data.dataset import load_dataset
from headstore.data.outputs import begin_output, clear_partial, end_output
from headstore.data.files import atomic_write_json, atomic_write_parquet, writing
from headstore.data.text_id import doc_text, text_ids
from headstore.featurize.store.api import Store
from headstore.heads.apply.pipeline import Pipeline
from headstore.heads.apply.search_lexical import LEXICAL_DIR, FusedRanker, build as build_lexical
from headstore.heads.network.features import read_features
from headstore.heads.artefacts.head import Head
from headstore.heads.artefacts.judged import read_judged
from headstore.heads.kinds.unlabeled import unlabeled_in_store

INDEX_FILE, ITEMS_FILE, INFO_FILE, HEAD_DIR = "index.faiss", "items.parquet", "index.json", "head"
EMBED_CHUNK = 65536  # corpus rows read and embedded at a time: bounds memory for large corpora
EF_CONSTRUCTION = 80  # HNSW build-time beam: 2x faiss' 40 buys recall for a one-off build cost
EF_SEARCH = 64  # HNSW query-time beam (>= k); raise it for recall, lower for speed


def _faiss():
    try:
        import faiss  # here: an optional extra (headstore[faiss])
    except ImportError:
        raise ValueError("cli index / search need FAISS: pip install 'headstore[faiss]'") from None
    return faiss


def _metric(faiss, energy: str) -> int:
    return {"l1": faiss.METRIC_L1, "l2": faiss.METRIC_L2, "cosine": faiss.METRIC_INNER_PRODUCT}[energy]


def _prepare(vectors: np.ndarray, energy: str) -> np.ndarray:
    """What goes into / searches the index: float32, rows L2-normalised for cosine heads."""
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    if energy == "cosine":
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-8)
    return x


def _to_energy(distances: np.ndarray, energy: str) -> np.ndarray:
    """FAISS distances -> the head's energies (low = similar)."""
    if energy == "cosine":
        return 1.0 - distances
    if energy == "l2":
        return np.sqrt(np.maximum(distances, 0.0))
    return distances


def document_space(head: Head) -> str:
    """A hash of what a head does to documents: for a query-side head, the store, array, energy and normaliser
    (its documents' vectors are their normalised features); for a head of both sides, also its weights."""
    h = hashlib.sha256()
    members = getattr(head, "members", [head])
    h.update(json.dumps([head.store_fingerprint, head.array, head.energy_name, len(members)]).encode())
    if head.memory is not None:  # the documents it edited, and how (the index holds its vectors)
        h.update(json.dumps([head.memory.judgements, head.memory.space, head.memory.move, head.memory.gamma]).encode())
    for m in members:
        h.update(m.normalizer.kind.encode())
        for t in (m.normalizer.center, m.normalizer.scale):
            h.update(t.detach().cpu().float().contiguous().numpy().tobytes())
        if not m.query_side:
            for name, p in sorted(m.model.state_dict().items()):
                h.update(name.encode() + p.detach().cpu().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def corpus_items(data_path: str | None, data_format: str | None = None, unlabeled: Sequence[str] = (),
                 store: Store | None = None) -> pl.DataFrame:
    """`id`, `text` of every item to index: a BEIR corpus's documents, else the dataset's unique texts of the
    document role (a query-document pairs table: its positives and negatives, not its query anchors); then the
    --unlabeled texts not among them (ids: text ids; checked against `store`, heads.kinds.unlabeled)."""
    frames = []
    if data_path is not None:
        ds = load_dataset(data_path, data_format)
        if ds.kind == "beir":
            corpus = ds.beir.corpus
            texts = [doc_text(t, x) for t, x in zip(corpus["title"].to_list(), corpus["text"].to_list())]
            frames.append(pl.DataFrame({"id": corpus["_id"].cast(pl.String), "text": texts}))
        else:
            texts = ds.texts_by_role()["document"]
            frames.append(pl.DataFrame({"id": text_ids(texts), "text": texts}))
    if unlabeled:
        found, _ = unlabeled_in_store(store.feature_store, unlabeled)  # one error naming what is missing
        seen = set(frames[0]["text"].to_list()) if frames else set()
        texts = [t for t in found.texts if t not in seen]  # a text of the dataset is indexed once
        frames.append(pl.DataFrame({"id": text_ids(texts), "text": texts}, schema={"id": pl.String, "text": pl.String}))
    if not frames:
        raise ValueError("nothing to index: give --data, --unlabeled or both")
    return pl.concat(frames)


def _index_inputs(out: Path, hnsw: int | None, store_path: str, head_ref: str) -> tuple[Store, Head]:
    """(store, head) for `build_index`, after the checks that refuse before any work: --out in use, --hnsw too small,
    another store than the head's (or its memory's)."""
    if out.exists() and not clear_partial(out, "index") and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: exists and is not an empty directory; give a new --out")
    if hnsw is not None and hnsw < 2:
        raise ValueError(f"--hnsw M needs M >= 2 links per node; got {hnsw}")
    store, head = Store.open(store_path), Head.load(head_ref)
    if store.fingerprint != head.store_fingerprint:
        raise ValueError(f"{store_path}: its fingerprint differs from the store {head_ref} was trained on "
                         f"({head.store_fingerprint[:12]}); index with the head's own store")
    if head.memory is not None:  # (the store's fingerprint is the head's: a memory of another store is refused)
        head.memory.check_store(store.fingerprint, f"{head_ref}: memory")
    return store, head


def build_index(store_path: str, head_ref: str, data_path: str | None, out_dir: str, hnsw: int | None = None,
                data_format: str | None = None, ef_construction: int = EF_CONSTRUCTION,
                progress: bool = True, unlabeled: Sequence[str] = ()) -> dict:
    """Embed the corpus of `data_path` and the `unlabeled` texts (stored features -> head) into a FAISS index at
    `out_dir`."""
    faiss, out = _faiss(), Path(out_dir)
    store, head = _index_inputs(out, hnsw, store_path, head_ref)
    items = corpus_items(data_path, data_format, unlabeled, store)
    if items.is_empty():
        raise ValueError(f"{data_path or ' '.join(unlabeled)}: no texts to index")
    try:
        rows = store.rows_for(items["text"].to_list())
    except KeyError as err:
        raise ValueError(f"{data_path}: {err.args[0]}") from None
    items = items.with_columns(pl.Series("row", rows), pl.Series("text_id", store.texts["text_id"].gather(rows)))
    energy = head.energy_name
    index = (faiss.IndexHNSWFlat(head.out_dim, hnsw, _metric(faiss, energy)) if hnsw
             else faiss.IndexFlat(head.out_dim, _metric(faiss, energy)))
    if hnsw:
        index.hnsw.efConstruction = ef_construction
    bar = progress_bar(total=len(rows), unit="text", desc="index", disable=not progress)
    for start in range(0, len(rows), EMBED_CHUNK):
        chunk = rows[start:start + EMBED_CHUNK]
        ids = items["text_id"][start:start + EMBED_CHUNK].to_list()  # documents the head's memory knows: its vectors
        index.add(_prepare(head.embed(read_features(store, head.array, rows=chunk), "document", ids), energy))
        bar.update(len(chunk))
    bar.close()
    out.mkdir(parents=True, exist_ok=True)
    begin_output(out, "index")  # an interrupted index (a full disk) is replaced by the same command's rerun
    head.save(out / HEAD_DIR)
    with writing(out / INDEX_FILE):  # a full disk: one line naming the file
        faiss.write_index(index, str(out / INDEX_FILE))  # faiss writes in place: the other files say it is whole
    atomic_write_parquet(out / ITEMS_FILE, items.select("id", "text_id", "text", "row"))
    judged = judged_share(head_ref, head, store, rows)
    lexical = build_lexical(out, head_ref, head, items["text"].to_list(), items["text_id"].to_list(),
                            judged.get("documents"),
                            lambda at: _prepare(head.embed(read_features(store, head.array, rows=rows[at]), "document"),
                                                energy))  # BM25 beside it where the head has lexical.json
    info = {"kind": "hnsw" if hnsw else "flat", "hnsw_m": hnsw, "ef_construction": ef_construction if hnsw else None,
            "metric": {"l1": "METRIC_L1", "l2": "METRIC_L2", "cosine": "METRIC_INNER_PRODUCT"}[energy],
            "energy": energy, "n": int(index.ntotal), "dim": head.out_dim, "head": head.source,
            "store": str(store_path), "store_fingerprint": store.fingerprint,
            "data": str(data_path) if data_path else None,
            **({"unlabeled": list(unlabeled)} if unlabeled else {}),
            "sides": "query" if head.query_side else "both", "document_space": document_space(head),
            "judged": judged,
            **({"memory": {**head.memory.describe(), "documents_indexed": int(np.isin(
                items["text_id"].to_numpy(), list(head.memory.text_ids)).sum())}} if head.memory is not None else {}),
            **({"lexical": lexical} if lexical else {})}
    atomic_write_json(out / INFO_FILE, info, sort_keys=True)
    end_output(out)
    return info


def judged_share(head_ref: str, head: Head, store: Store, rows: np.ndarray) -> dict:
    """How many indexed documents the head's training judged relevant (heads.kinds.seen: a query on one of them is
    seen, its figure the head's learned one; the others are new to it), or why that is not known."""
    judged, why = read_judged(head_ref, head.config, store.feature_store)
    if judged is None:
        return {"note": why}
    n = int(np.isin(rows, np.fromiter(judged, dtype=np.int64, count=len(judged))).sum())
    return {"documents": n, "of": int(len(rows)),
            **({"note": "all unseen: no indexed document was judged in the head's training"} if not n else {})}


def _read_index(faiss, path: Path):
    """faiss.read_index, its RuntimeError (a truncated or damaged file) a ValueError naming the file."""
    try:
        return faiss.read_index(str(path))
    except RuntimeError as err:
        if path.stat().st_size == 0:
            raise ValueError(f"{path}: empty file (0 bytes), not a FAISS index (rebuild the index with "
                             "`cli index`)") from None
        reason = str(err).strip().splitlines()[-1]  # "Error in F at index_read.cpp:N: Error: 'ret == (size)' failed:
        # read error in PATH: 775 != 1600 (Success)": keep what it says, not where FAISS checked it
        reason = re.sub(r"^Error in .*? at \S+:\d+: (Error: )?('.*?' failed: )?", "", reason)
        reason = reason.replace(f" in {path}", "").removesuffix(" (Success)")
        raise ValueError(f"{path}: not a readable FAISS index ({reason}) (the file may be truncated or damaged; "
                         "rebuild the index with `cli index`)") from None


class SearchIndex:
    """An index directory opened for search: `search_vectors` (head outputs) or `search` (texts)."""

    def __init__(self, index_dir: str | Path, ef_search: int = EF_SEARCH, head: str | Head | None = None,
                 lexical: bool = True):
        d = Path(index_dir)
        missing = [n for n in (INDEX_FILE, ITEMS_FILE, INFO_FILE, HEAD_DIR) if not (d / n).exists()]
        if missing:
            raise FileNotFoundError(f"{d}: missing {missing} (is this a `cli index --out` directory?)")
        faiss = _faiss()
        self.dir, self.info = d, json.loads((d / INFO_FILE).read_text())
        self.index = _read_index(faiss, d / INDEX_FILE)
        self.items = pl.read_parquet(d / ITEMS_FILE)
        if self.index.ntotal != self.items.height:
            raise ValueError(f"{d}: {INDEX_FILE} holds {self.index.ntotal} vectors, {ITEMS_FILE} "
                             f"{self.items.height} items; the index is incomplete, rebuild it")
        if self.info["kind"] == "hnsw":
            self.index.hnsw.efSearch = ef_search
        self.head = Head.load(d / HEAD_DIR)
        if head is not None:
            self.head = self._other_head(head if isinstance(head, Head) else Head.load(head))
        self._pipeline = None
        self.notes: list[str] = []  # what a search capped or cut, for the caller to say
        self.fused = (FusedRanker(d, self) if lexical and head is None and (d / LEXICAL_DIR).is_dir() else None)  # BM25
        # fused in as eval does (heads.apply.search_lexical); another head's scores were never fitted with it

    def _other_head(self, head: Head) -> Head:
        """`head` if its documents lie where the index's do (`document_space`), else ValueError saying why."""
        own = self.info.get("document_space") or document_space(self.head)  # indexes made before it was recorded
        if head.energy_name != self.info["energy"] or document_space(head) != own:
            why = ("both must be query-side heads (--sides query) on the same store, array, normaliser and energy"
                   if head.query_side and self.head.query_side else
                   "only query-side heads (--sides query) share an index: a head of both sides moves its documents")
            raise ValueError(f"{head.source}: its documents are not where {self.dir}'s vectors are ({self.head.source}, "
                             f"{self.info['energy']} energy); {why}. Index the corpus with this head "
                             "(`cli index --head ...`)")
        return head

    def search_vectors(self, vectors: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """(positions (Q, k) int64, energies (Q, k)) of the k lowest-energy items per head output."""
        if k < 1:
            raise ValueError(f"k must be >= 1; got {k}")
        if k > self.index.ntotal:
            self.notes.append(f"--k {k} is more than the {self.index.ntotal} items of the index: "
                              f"{self.index.ntotal} results per query")
            k = self.index.ntotal
        if self.info["kind"] == "hnsw":
            self.index.hnsw.efSearch = max(self.index.hnsw.efSearch, k)
        dist, pos = self.index.search(_prepare(vectors, self.info["energy"]), k)
        return pos, _to_energy(dist, self.info["energy"])

    def pipeline(self, model: str | None = None):
        if self._pipeline is None:
            self._pipeline = Pipeline.from_head(self.head, model)
        return self._pipeline

    def search(self, queries: Sequence[str], k: int = 10, model: str | None = None) -> list[list[dict]]:
        """Per query, the top k items: rank, id, text, energy (ascending)."""
        pipe = self.pipeline(model)
        vectors = pipe.encode(list(queries), role="query")  # the store's query prompt, as BEIR queries were
        if pipe.last_truncated:
            self.notes.append(f"{pipe.last_truncated} of {len(queries)} queries are longer than the encoder's "
                              f"{pipe.max_length} tokens and were cut to them (as featurize cuts stored texts)")
        ids, texts = self.items["id"].to_list(), self.items["text"].to_list()
        if self.fused is not None:  # ranked by the fused score (higher = better)
            if k < 1:
                raise ValueError(f"k must be >= 1; got {k}")
            if k > self.index.ntotal:
                self.notes.append(f"--k {k} is more than the {self.index.ntotal} items of the index: "
                                  f"{self.index.ntotal} results per query")
            pos, scores = self.fused.rank(list(queries), _prepare(vectors, self.info["energy"]), min(k, self.index.ntotal))
            return [[{"rank": r + 1, "id": ids[p], "text": texts[p], "score": float(s)}
                     for r, (p, s) in enumerate(zip(pos[q], scores[q])) if p >= 0] for q in range(len(queries))]
        pos, energies = self.search_vectors(vectors, k)
        return [[{"rank": r + 1, "id": ids[p], "text": texts[p], "energy": float(e)}
                 for r, (p, e) in enumerate(zip(pos[q], energies[q])) if p >= 0]
                for q in range(len(queries))]


def recall_at_k(approx: np.ndarray, exact: np.ndarray) -> float:
    """Mean over queries of |approx top-k ∩ exact top-k| / k."""
    k = exact.shape[1]
    return float(np.mean([len(set(a.tolist()) & set(e.tolist())) / k for a, e in zip(approx, exact)]))


def short(text: str, width: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def results_table(query: str, hits: list[dict]) -> str:
    """The terminal view of one query's hits."""
    from tabulate import tabulate

    key = "score" if hits and "score" in hits[0] else "energy"  # score: fused with BM25 (higher = better)
    rows = [(h["rank"], h["id"], f"{h[key]:.4f}", short(h["text"])) for h in hits]
    return f"query: {short(query, 100)}\n" + tabulate(rows, headers=["rank", "id", key, "text"])

