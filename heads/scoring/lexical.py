"""A lexical channel beside the dense scores: BM25 over the corpus's own texts (docs/memory.md, "Lexical fusion").

A frozen encoder and a head trained on a few thousand judgements both miss what BM25 catches on new documents:
the rare words a query shares with its relevant text. The fused score of a query q and a document d is

    fused(q, d) = dense(q, d) / sd_q(dense) + w * bm25(q, d) / sd_q(bm25)

(dense = minus the head's energy; sd_q = the standard deviation of that score over the query's whole corpus, so
w weighs two scores of one scale per query, whatever the energy; a per-query shift changes no ranking). The BM25
index is built from the split's document texts (bm25s, an optional extra: pip install 'headstore[lexical]');
nothing of it is stored: it is rebuilt from the dataset in seconds, and its settings are saved beside the head.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

LEXICAL_VERSION = 2  # bump when the tokenisation, the scoring or the fusion rule changes (2: words stemmed)


@dataclass(frozen=True)
class Bm25Config:
    k1: float = 1.2  # term-frequency saturation: Lucene's and the BEIR BM25 baseline's value
    b: float = 0.75  # length normalisation: the same baseline's value
    method: str = "lucene"  # bm25s's variant of the formula (Lucene's idf, never negative)
    stopwords: str = "en"  # bm25s's English list: "the", "of" carry no evidence
    token_pattern: str = r"(?u)\b\w\w+\b"  # words of two or more characters, lower-cased (scikit-learn's rule)
    stemmer: str = "english"  # PyStemmer's Snowball stemmer ("proteins" meets "protein"; "" = none): on SciFact
    # BM25 alone 0.6625 -> 0.6791 test, 0.6468 -> 0.7191 dev (docs/memory.md, "Lexical fusion")

    def __post_init__(self):
        _stemmer(self.stemmer)  # a bad name is one line here, where the settings are read

    def to_dict(self) -> dict:
        return {"kind": "bm25", **asdict(self), "version": LEXICAL_VERSION}


def _bm25s():
    try:
        import bm25s  # an optional extra
    except ImportError as e:
        raise ValueError("lexical fusion needs bm25s: pip install 'headstore[lexical]' (or --no-lexical)") from e
    return bm25s


def _stemmer(name: str):
    """PyStemmer's stemWords for `name` (None for ""); a name it does not know lists the ones it does."""
    if not name:
        return None
    try:
        import Stemmer  # PyStemmer, with bm25s in the optional extra
    except ImportError as e:
        raise ValueError("lexical fusion needs PyStemmer: pip install 'headstore[lexical]' (or --no-lexical)") from e
    try:
        return Stemmer.Stemmer(name).stemWords
    except KeyError:
        raise ValueError(f"BM25 stemmer {name!r}; valid: {sorted(Stemmer.algorithms())} or ''") from None


def _words(texts: list[str], cfg: Bm25Config, return_ids: bool):
    """bm25s's tokens of `texts` under cfg: lower-cased words, stop words out, each stemmed (cfg.stemmer)."""
    return _bm25s().tokenize(list(texts), stopwords=cfg.stopwords, token_pattern=cfg.token_pattern,
                             stemmer=_stemmer(cfg.stemmer), return_ids=return_ids, show_progress=False)


class Bm25Index:
    """BM25 over a list of document texts; `scores(query texts)` -> (Q, N) float32; `save` / `load` a folder."""

    def __init__(self, doc_texts: list[str] | None, cfg: Bm25Config | None = None):
        bm25s = _bm25s()
        self.cfg = cfg or Bm25Config()
        self.n = 0 if doc_texts is None else len(doc_texts)
        if doc_texts is None:  # (load fills the index)
            return
        tokens = _words(doc_texts, self.cfg, return_ids=True)
        self.index = bm25s.BM25(k1=self.cfg.k1, b=self.cfg.b, method=self.cfg.method)
        self.index.index(tokens, show_progress=False)

    def save(self, folder) -> None:
        self.index.save(str(folder), show_progress=False)

    @classmethod
    def load(cls, folder, cfg: Bm25Config, n: int) -> Bm25Index:
        """The index `save` wrote for `n` documents; a damaged or partial folder is one clear line."""
        bm25s, out = _bm25s(), cls(None, cfg)
        try:
            out.index = bm25s.BM25.load(str(folder), show_progress=False)
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"{folder}: not a readable BM25 index ({type(e).__name__}: {e}); rebuild the index "
                             "with `cli index`") from None
        out.n = n
        if int(out.index.scores["num_docs"]) != n:
            raise ValueError(f"{folder}: a BM25 index of {out.index.scores['num_docs']} documents beside {n} "
                             "indexed items; rebuild the index with `cli index`")
        return out

    def scores(self, query_texts: list[str]) -> torch.Tensor:
        words = _words(query_texts, self.cfg, return_ids=False)
        out = np.zeros((len(words), self.n), dtype=np.float32)
        for i, w in enumerate(words):
            if w:  # a query of stop words only scores 0 everywhere
                out[i] = self.index.get_scores(w)
        return torch.from_numpy(out)


LEXICAL = {"bm25": (Bm25Config, Bm25Index)}


SCALE_SAMPLE = 8192  # documents each query's spread is measured on: all of a corpus up to this size, else this many
# evenly spaced (the same in eval and in `cli search`, which cannot score a large corpus whole)


def scale_columns(n: int) -> np.ndarray:
    """The corpus positions a query's score spread is measured on (heads.scoring.lexical.SCALE_SAMPLE)."""
    return np.arange(n) if n <= SCALE_SAMPLE else np.linspace(0, n - 1, SCALE_SAMPLE).round().astype(np.int64)


def spread(scores: torch.Tensor) -> torch.Tensor:
    """(Q, 1) each query's standard deviation of (Q, N) scores over the corpus's scale_columns."""
    return scores[:, torch.as_tensor(scale_columns(scores.shape[1]))].std(dim=1, keepdim=True)


def per_query_scaled(scores: torch.Tensor, sd: torch.Tensor | None = None) -> torch.Tensor:
    """(Q, N) scores divided by each query's spread (`spread`, or `sd` (Q, 1) given); a constant row stays 0."""
    sd = spread(scores) if sd is None else sd
    return torch.where(sd > 0, scores / sd.clamp_min(1e-12), torch.zeros_like(scores))


def fused(dense: torch.Tensor, lexical: torch.Tensor, weight: float, sd_dense: torch.Tensor | None = None,
          sd_lexical: torch.Tensor | None = None) -> torch.Tensor:
    """(Q, N) fused scores (higher = better) of dense scores (higher = better) and lexical ones at `weight`, each
    divided by its query's spread (`spread` of the scores given, or the (Q, 1) spreads given: `cli search` scores
    only candidates, the spread being measured on the same documents as eval's)."""
    if weight == 0:
        return dense
    return per_query_scaled(dense, sd_dense) + weight * per_query_scaled(lexical, sd_lexical)


def gained(plain, edited, gain: float):
    """The document memory's change of score scaled by `gain`: plain + gain (edited - plain) (1: the memory as
    fitted, 0: none); linear in the score, so the same in either space it acts in and for any energy."""
    return plain + gain * (edited - plain)
