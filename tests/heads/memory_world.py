"""A tiny BEIR folder where the memory has something to do: dev and most test queries ask for documents the
training judged (their texts are a training query's plus a word: near it in a random encoder too), a few test
queries for documents never judged; a random BERT, a float32 store, a head trained with its memory."""
from __future__ import annotations

import json
import random
from pathlib import Path

from .finetune_world import sentence, tiny_bert

N_DOCS, N_JUDGED, N_UNSEEN = 40, 12, 4  # documents; judged in training (one query each); unseen test documents


def seen_beir(folder: Path, seed: int = 5, n_unseen: int = N_UNSEEN, query_is_doc: bool = False) -> Path:
    """query_is_doc: training query t0's text is document d0's (bad input for a memory)."""
    rng = random.Random(seed)
    (folder / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": sentence(rng, 2), "text": sentence(rng, 8) + f" {i}"} for i in range(N_DOCS)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    train = {f"t{i}": sentence(rng, 4) + f" {i}" for i in range(N_JUDGED)}
    queries = [{"_id": q, "text": t} for q, t in train.items()]
    queries += [{"_id": f"v{i}", "text": train[f"t{i}"] + " please"} for i in range(N_JUDGED)]  # dev: seen
    queries += [{"_id": f"s{i}", "text": train[f"t{i}"] + " now"} for i in range(N_JUDGED)]  # test: seen
    queries += [{"_id": f"u{i}", "text": sentence(rng, 4) + f" new {i}"} for i in range(n_unseen)]  # test: unseen
    if query_is_doc:
        queries[0]["text"] = (docs[0]["title"] + " " + docs[0]["text"]).strip()
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    head = "query-id\tcorpus-id\tscore\n"
    (folder / "qrels" / "train.tsv").write_text(head + "".join(f"t{i}\td{i}\t1\n" for i in range(N_JUDGED)))
    (folder / "qrels" / "dev.tsv").write_text(head + "".join(f"v{i}\td{i}\t1\n" for i in range(N_JUDGED)))
    (folder / "qrels" / "test.tsv").write_text(head + "".join(f"s{i}\td{i}\t1\n" for i in range(N_JUDGED)) +
                                               "".join(f"u{i}\td{N_JUDGED + i}\t1\n" for i in range(n_unseen)))
    return folder


class MemoryWorld:
    def __init__(self, root: Path):
        from headstore.featurize.encoder.config import FeaturizeConfig
        from headstore.featurize.run.local import featurize
        from headstore.heads.settings.config import HeadConfig, TrainConfig
        from headstore.heads.training.run import train_head

        self.root = root
        self.model = tiny_bert(root / "model", layers=2)
        self.beir = seen_beir(root / "seen")
        self.store = root / "store"
        featurize(FeaturizeConfig(model=str(self.model), dtype="float32", batch_tokens=2048), [str(self.beir)],
                  self.store)
        self.head = root / "head"
        self.metrics = train_head(str(self.store), str(self.beir), str(self.head), HeadConfig(hidden=16),
                                  TrainConfig(epochs=2, batch_size=4, mined_k=2), progress=False)
