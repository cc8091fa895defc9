"""Pseudo-queries as the distillation's unlabeled anchors (issue 42): does a query-like anchor beat a whole abstract?

The SciFact distillation draws its 2,000 unlabeled anchors from the corpus's abstracts: the teacher then scores
abstract -> abstract candidate sets, a task unlike claim -> abstract. Here each abstract gives one sentence
instead, a pseudo-query in the manner of the inverse cloze task (Lee et al. 2019: a sentence as the query, its
passage as the context): a sentence of 8-50 words drawn at random (seed 0) from the abstract, none equal to a
SciFact query (compared lower-cased). The candidates stay the corpus; everything else is distill_study.py's
6-head teacher at today's defaults. The anchors' pool is swapped for this study only (no product option: it did
not help, docs/distill.md).

    python3 bench/studies/distill_pseudo_queries.py --sentences WORK/pseudo/sentences.parquet   # writes them
    cp -a STORE WORK/store-scifact-pseudo
    cli featurize --store WORK/store-scifact-pseudo --unlabeled WORK/pseudo/sentences.parquet --model minilm \\
        --max-length 256 --precision bf16
    python3 bench/studies/distill_pseudo_queries.py --sentences WORK/pseudo/sentences.parquet --work WORK \\
        --scifact-store WORK/store-scifact-pseudo --json OUT.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import random
import re
import sys
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))

import distill_study  # noqa: E402
import headstore.heads.experiments.distill.run as distill_module  # noqa: E402
from headstore.featurize.store.reader import FeatureStore  # noqa: E402
from headstore.heads.experiments.compare.datasets_root import datasets_root  # noqa: E402
from limits import machine, machine_line  # noqa: E402

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")
WORDS = (8, 50)  # SciFact claims are one sentence of ~12 words; shorter fragments are headings or numbers


def write_sentences(scifact: Path, out: Path) -> None:
    """One random sentence of each abstract (module doc) to `out` (Parquet, column text)."""
    queries = {json.loads(line)["text"].strip().lower() for line in open(scifact / "queries.jsonl")}
    rng, picked, without = random.Random(0), [], 0
    for line in open(scifact / "corpus.jsonl"):
        text = json.loads(line)["text"]
        sentences = [s.strip() for s in SENTENCE_END.split(text) if WORDS[0] <= len(s.split()) <= WORDS[1]]
        sentences = [s for s in sentences if s.lower() not in queries]
        if sentences:
            picked.append(rng.choice(sentences))
        else:
            without += 1
    picked = list(dict.fromkeys(picked))
    out.parent.mkdir(parents=True, exist_ok=True)
    pl.DataFrame({"text": picked}).write_parquet(out)
    print(f"{len(picked)} pseudo-queries written to {out}; {without} abstracts had no sentence of {WORDS} words")


def swap_anchor_pool(store_path: str, sentences: Path) -> None:
    """Make the distillation draw its unlabeled anchors from the pseudo-queries' store rows (query role)."""
    texts = pl.read_parquet(sentences)["text"].to_list()
    store = FeatureStore.open(store_path)
    rows = store.find_rows(store.row_ids(texts, "query"))
    if (rows < 0).any():
        raise SystemExit(f"{int((rows < 0).sum())} pseudo-queries are not in {store_path}: featurize them (module doc)")
    original = distill_module.anchor_and_corpus_rows

    def anchor_and_corpus_rows(task, n_unlabeled: int, seed: int):
        own, corpus, report = original(task, 0, seed)
        pool = np.setdiff1d(rows, own)
        drawn = np.sort(np.random.default_rng(seed).choice(pool, size=min(n_unlabeled, len(pool)), replace=False))
        return np.concatenate([own, drawn]), corpus, report | {
            "unlabeled_anchors": int(len(drawn)), "unlabeled_available": int(len(pool)),
            "unlabeled_from": "pseudo-queries (one sentence of each abstract)"}

    distill_module.anchor_and_corpus_rows = anchor_and_corpus_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", required=True, help="The pseudo-queries' Parquet (written when absent).")
    parser.add_argument("--work", default=None, help="distill_study.py's WORK (its grid and teachers).")
    parser.add_argument("--scifact-store", default=None, help="A copy of the store with the sentences featurized.")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--tag", default="pseudo-queries")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    sentences = Path(args.sentences)
    if not sentences.is_file():
        write_sentences(datasets_root() / "scifact", sentences)
    if not args.work:
        return
    m = machine()
    print(machine_line(m))
    swap_anchor_pool(args.scifact_store, sentences)
    study = argparse.Namespace(work=args.work, scifact_store=args.scifact_store, k=2, teacher_seeds="0,1,2",
                               tag=args.tag, single=None, tuned_teacher=None)
    records = [distill_study.run_one(study, "scifact", int(s), "with", {}) for s in args.seeds.split(",")]
    rows = distill_study.summarize(records)
    print(distill_study.table(rows))
    date = datetime.date.today().isoformat()
    path = Path(args.json or Path(__file__).resolve().parents[1] / "results" / f"distill-pseudo-queries-{date}.json")
    path.write_text(json.dumps({"date": date, "machine": m, "rows": rows,
                                "runs": [{k: v for k, v in r.items() if k != "items"} for r in records]},
                               indent=1, default=float))
    print(f"written: {path}")


if __name__ == "__main__":
    main()
