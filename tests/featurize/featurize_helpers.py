"""A tiny randomly initialised BERT (hidden 32, 2 layers) with a locally built tokenizer."""

from __future__ import annotations

import random

WORDS = ("the a cat dog sat on mat and then it slept ran far away near house tree river "
         "blue green red small large quick slow model store text feature encode read write "
         "one two three four five six seven eight nine ten").split()


def random_texts(n: int, seed: int = 0, max_words: int = 30) -> list[str]:
    """Deterministic sentences of varied length (some longer than the tiny model's max length)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, max_words))) + f" {i}"
            for i in range(n)]


def build_tiny_bert(folder, max_length: int = 24, seed: int = 0) -> str:
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *"0123456789",
             *[f"##{d}" for d in "0123456789"]]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(folder / "vocab.txt"), model_max_length=max_length)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    BertModel(config).eval().save_pretrained(folder, safe_serialization=True)
    return str(folder)


