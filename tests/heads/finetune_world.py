"""A tiny world for finetune / compare tests: a random 3-layer BERT, a BEIR folder, an STS table, a store."""
from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl

WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river tree stone".split()


def tiny_bert(folder: Path, layers: int = 3) -> Path:
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *"0123456789", *[f"##{d}" for d in "0123456789"]]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(vocab=str(folder / "vocab.txt"), model_max_length=32)
    assert tok.unk_token_id not in tok("alpha beta 12")["input_ids"]  # transformers 5: vocab=, not vocab_file=
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    BertModel(cfg).eval().save_pretrained(folder, safe_serialization=True)
    return folder


def sentence(rng, n=6):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def tiny_beir(folder: Path, seed: int = 0, n_docs: int = 60, n_train: int = 30, n_test: int = 10) -> Path:
    rng = random.Random(seed)
    (folder / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": sentence(rng, 2), "text": sentence(rng, 8) + f" {i}"} for i in range(n_docs)]
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    n_q = n_train + n_test
    queries = [{"_id": f"q{i}", "text": docs[i]["text"].split()[0] + " " + sentence(rng, 3) + f" {i}"} for i in range(n_q)]
    (folder / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries) + "\n")
    head = "query-id\tcorpus-id\tscore\n"
    if n_train:  # a header-only qrels file is an error
        (folder / "qrels" / "train.tsv").write_text(head + "".join(f"q{i}\td{i}\t1\n" for i in range(n_train)))
    (folder / "qrels" / "test.tsv").write_text(head + "".join(f"q{i}\td{i}\t1\n" for i in range(n_train, n_q)))
    return folder


def tiny_sts(path: Path, seed: int = 0, n: int = 40) -> Path:
    rng = random.Random(seed)
    pl.DataFrame({"sentence1": [sentence(rng) + f" {i}" for i in range(n)],
                  "sentence2": [sentence(rng) + f" {i}" for i in range(n)],
                  "score": [float(rng.uniform(0, 5)) for _ in range(n)],
                  "split": ["train"] * (n // 2) + ["test"] * (n - n // 2)}).write_parquet(path)
    return path


def trained_head_world(root: Path, layers: int, epochs: int, **beir_sizes) -> tuple:
    """(root, model, beir, store, head): a tiny BERT, a tiny BEIR folder featurized in fp32 and a small head
    trained on it, the starting point of every finetune test."""
    from headstore.featurize.encoder.config import FeaturizeConfig
    from headstore.featurize.run.local import featurize
    from headstore.heads.settings.config import HeadConfig, TrainConfig
    from headstore.heads.training.run import train_head

    model = tiny_bert(root / "model", layers=layers)
    beir = tiny_beir(root / "beir", **beir_sizes)
    store = root / "store"
    featurize(FeaturizeConfig(model=str(model), dtype="float32", batch_tokens=2048), [str(beir)], store)
    head = root / "head"
    train_head(str(store), str(beir), str(head), HeadConfig(hidden=16, out_dim=8, residual=False),
               TrainConfig(epochs=epochs, batch_size=8), progress=False)
    return root, model, beir, store, head
