"""Unlabeled text for masked-language-model training: reading, held-out split, packing, batching.

Texts are tokenised without special tokens and concatenated into one stream, documents separated
by [SEP]; the stream is cut into blocks of `max_length - 2` tokens and each block framed as
[CLS] … [SEP]. Packing wastes no compute on padding (only the last block is short) and lets short
passages share a block, which is how BERT-style pre-training reads text.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from headstore.data.text_id import doc_text, text_id
from headstore.featurize.tuning.masking import MaskingVocab, mask_tokens

PLAIN_TEXT_SUFFIXES = (".txt", ".text", ".parquet")


def load_texts(path: str | Path, column: str = "text", split: str | None = None) -> list[str]:
    """Every text in `path`: an IR corpus folder → its documents (title + text); a .txt → one
    passage per non-empty line; a Parquet file → its `column`; other formats via
    `data.dataset.load_dataset(path).texts()`. `split` keeps only rows of that split (text files)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file or folder")
    if path.is_file() and path.suffix.lower() in PLAIN_TEXT_SUFFIXES:
        from headstore.data.readers import read_text

        frame = read_text(path, column=column)
        if split is not None:
            splits = sorted(set(frame["split"].to_list()))
            if split not in splits:
                raise ValueError(f"{path}: no split {split!r}; its splits are {', '.join(splits)}")
            frame = frame.filter(frame["split"] == split)
        return frame["text"].to_list()
    if split is not None:
        raise ValueError(f"{path}: split= only applies to .txt/.parquet text files")
    if path.is_dir() and (path / "corpus.jsonl").is_file():
        from headstore.data.readers import read_beir

        corpus = read_beir(path).corpus  # the unlabeled text of an IR set is its documents
        return [doc_text(t, x) for t, x in zip(corpus["title"].to_list(), corpus["text"].to_list())]
    try:
        from headstore.data.dataset import load_dataset
    except ImportError:  # data.dataset not written yet
        raise ValueError(f"{path}: not a .txt/.parquet file or an IR corpus folder") from None
    return load_dataset(path).texts()


def split_holdout(texts: list[str], fraction: float) -> tuple[list[str], list[str]]:
    """(train, held_out): a text is held out when its text_id falls in the first `fraction` of
    the hash range, so the split is the same on every run and for every caller."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"holdout fraction must be in [0, 1), got {fraction}")
    cut = int(fraction * 2**32)
    held = [int(text_id(t)[:8], 16) < cut for t in texts]
    return ([t for t, h in zip(texts, held) if not h], [t for t, h in zip(texts, held) if h])


def texts_fingerprint(texts: list[str]) -> str:
    """sha256 over the texts in order (a resumed run must train on the same data)."""
    digest = hashlib.sha256()
    for t in texts:
        digest.update(t.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()


def pack_texts(texts: list[str], tokenizer, max_length: int, batch: int = 1000) -> list[list[int]]:
    """Blocks of token ids, each [CLS] + ≤ max_length-2 stream tokens + [SEP]."""
    if max_length < 4:
        raise ValueError(f"max_length must be at least 4 to hold [CLS] x y [SEP], got {max_length}")
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls_id is None or sep_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} lacks [CLS]/[SEP]; packing needs both")
    stream: list[int] = []
    for start in range(0, len(texts), batch):
        encoded = tokenizer(texts[start:start + batch], add_special_tokens=False,
                            return_attention_mask=False, verbose=False)["input_ids"]
        for ids in encoded:
            if ids:
                stream.extend(ids)
                stream.append(sep_id)
    body = max_length - 2
    blocks, chunk = [], []
    for token in stream:
        if token == sep_id and not chunk:
            continue  # the frame's [CLS] already starts the block
        chunk.append(token)
        if len(chunk) == body:
            if chunk[-1] == sep_id:
                chunk.pop()  # the frame's [SEP] already ends the document
            blocks.append([cls_id, *chunk, sep_id])
            chunk = []
    if chunk and chunk[-1] == sep_id:
        chunk.pop()
    if chunk:
        blocks.append([cls_id, *chunk, sep_id])
    return blocks


@dataclass
class MaskedBatch:
    input_ids: torch.Tensor  # (B, T) with masks applied
    attention_mask: torch.Tensor  # (B, T)
    labels: torch.Tensor  # (B, T), IGNORE_INDEX where not predicted


class MLMCollator:
    """Pads blocks to the batch's longest and draws a fresh mask for every batch."""

    def __init__(self, tokenizer, vocab_size: int, mlm_probability: float, whole_word: bool):
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.special_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
        self.vocab = MaskingVocab.from_tokenizer(tokenizer)
        self.vocab_size = vocab_size
        self.mlm_probability = mlm_probability
        self.whole_word = whole_word

    def pad(self, blocks: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask, special_tokens_mask), each (B, T)."""
        width = max(len(b) for b in blocks)
        ids = torch.full((len(blocks), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(blocks), width), dtype=torch.long)
        for row, block in enumerate(blocks):
            ids[row, :len(block)] = torch.tensor(block, dtype=torch.long)
            attention[row, :len(block)] = 1
        special = torch.isin(ids, self.special_ids) | (attention == 0)
        return ids, attention, special

    def __call__(self, blocks: list[list[int]], generator: torch.Generator) -> MaskedBatch:
        ids, attention, special = self.pad(blocks)
        masked, labels = mask_tokens(ids, special, attention, self.vocab, self.vocab_size, generator,
                                     self.mlm_probability, whole_word=self.whole_word)
        return MaskedBatch(masked, attention, labels)
