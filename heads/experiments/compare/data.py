"""A seeded subsample of a BEIR folder, for a `cli compare` that must fit a CPU budget (`max_docs`).

Every encoder of a compare run featurizes the whole corpus of each dataset, and the corpus is what costs
(SciFact's 5,183 abstracts are 1.27M of its 1.29M tokens at 256). The subsample keeps a random set of
queries with every document judged for them, then fills the corpus with random other documents up to
`max_docs`, so each kept query still has all its relevant documents among distractors. Retrieval among
fewer distractors is easier: figures of a subsample are not comparable with full-corpus ones, but every
setup of the run sees the same subsample, so the paired differences stay like for like.
"""
from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from headstore.data.keys import content_digest

SUBSAMPLE_VERSION = 1  # bumped when the subsample drawn from the same folder, size and seed changes
JUDGED_SHARE = 0.5  # at most this share of the kept corpus is judged documents; the rest are distractors


def _read_qrels(path: Path) -> tuple[str, list[list[str]]]:
    lines = path.read_text().splitlines()
    return lines[0], [line.split("\t") for line in lines[1:] if line.strip()]


def subsample_beir(src: str, out_root: Path, max_docs: int, seed: int) -> str:
    """The subsample of BEIR folder `src` under out_root/<key>/<src's name> (written once; the same
    contents of `src`, size, seed and SUBSAMPLE_VERSION give the same folder); `src` itself when it is not a BEIR folder or is small enough."""
    folder = Path(src)
    if not (folder / "corpus.jsonl").is_file() or not (folder / "qrels").is_dir():
        return src  # an STS / pairs table: its pairs are few and short
    docs = [json.loads(line) for line in (folder / "corpus.jsonl").read_text().splitlines() if line.strip()]
    if len(docs) <= max_docs:
        return src
    key = hashlib.sha256(json.dumps([content_digest(folder, "--in-domain / --out-of-domain"), max_docs, seed,
                                     SUBSAMPLE_VERSION]).encode()).hexdigest()[:10]  # data/keys.py's rule
    dest = out_root / key / folder.name
    if (dest / "corpus.jsonl").is_file():
        return str(dest)
    rng = random.Random(seed)
    qrels = {p.name: _read_qrels(p) for p in sorted((folder / "qrels").glob("*.tsv"))}
    judged: dict[str, set[str]] = {}
    for _, rows in qrels.values():
        for q, d, *_ in rows:
            judged.setdefault(q, set()).add(d)
    queries = sorted(judged)
    rng.shuffle(queries)
    kept_q, kept_d = set(), set()
    for q in queries:  # queries in random order while their judged documents fit the judged share
        if len(kept_d | judged[q]) <= JUDGED_SHARE * max_docs:
            kept_q.add(q)
            kept_d |= judged[q]
    others = sorted(d["_id"] for d in docs if d["_id"] not in kept_d)
    kept_d |= set(rng.sample(others, max_docs - len(kept_d)))
    _write(folder, dest, docs, kept_q, kept_d, qrels)
    return str(dest)


def _write(folder: Path, dest: Path, docs: list[dict], kept_q: set, kept_d: set, qrels: dict) -> None:
    tmp = dest.with_name(dest.name + ".partial")
    (tmp / "qrels").mkdir(parents=True, exist_ok=True)
    (tmp / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs if d["_id"] in kept_d))
    queries = [json.loads(line) for line in (folder / "queries.jsonl").read_text().splitlines() if line.strip()]
    (tmp / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries if q["_id"] in kept_q))
    for name, (header, rows) in qrels.items():
        kept = [r for r in rows if r[0] in kept_q and r[1] in kept_d]
        if kept:  # a split none of whose queries was kept is left out (a header-only qrels file is an error)
            (tmp / "qrels" / name).write_text(header + "\n" + "".join("\t".join(r) + "\n" for r in kept))
    tmp.rename(dest)
