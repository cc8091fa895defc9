"""Unlabeled text for masked-language-model training: reading, held-out split, packing, batching.

Texts are tokenised without special tokens and concatenated into one stream, documents separated
by [SEP]; the stream is cut into blocks of `max_length - 2` tokens and each block framed as
[CLS] … [SEP]. Packing wastes no compute on padding (only the last block is short) and lets short
passages share a block, which is how BERT-style pre-training reads text.

Masking is transformers' `DataCollatorForLanguageModeling` (`MLMCollator` pads, masks, and redraws
a mask that predicts nothing): `mlm_probability` of the non-special tokens are predicted, 80% become
[MASK], 10% a random token, 10% stay; masks are drawn afresh every batch from the collator's own
seeded generator. Whole-word masking is the same collator's `whole_word_mask`: words come from the
tokenizer's character offsets (kept beside the ids by `pack_texts(offsets=True)`), and every piece of
a selected word becomes [MASK] (transformers does no random replacement under whole-word masking).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from headstore.data.text_id import doc_text, text_id

IGNORE_INDEX = -100  # label value the MLM loss skips (transformers' collators, torch cross_entropy)

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


def pack_texts(texts: list[str], tokenizer, max_length: int, batch: int = 1000,
               offsets: bool = False) -> list[dict]:
    """Blocks {"input_ids": [CLS] + ≤ max_length-2 stream tokens + [SEP]}; with `offsets`, also each
    token's character span in its text ("offset_mapping", (0, 0) for [CLS]/[SEP]) for whole-word masking."""
    if max_length < 4:
        raise ValueError(f"max_length must be at least 4 to hold [CLS] x y [SEP], got {max_length}")
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls_id is None or sep_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} lacks [CLS]/[SEP]; packing needs both")
    if offsets and not tokenizer.is_fast:
        raise ValueError(f"whole-word masking needs a fast tokenizer (character offsets); "
                         f"{type(tokenizer).__name__} is not")
    ids, spans = [], []  # the stream: token ids, and their character spans when `offsets`
    for start in range(0, len(texts), batch):
        encoded = tokenizer(texts[start:start + batch], add_special_tokens=False, return_attention_mask=False,
                            return_offsets_mapping=offsets, verbose=False)
        for i, doc in enumerate(encoded["input_ids"]):
            if doc:
                ids += [*doc, sep_id]
                if offsets:
                    spans += [*map(tuple, encoded["offset_mapping"][i]), (0, 0)]
    blocks = []
    for begin, end in _block_bounds(ids, max_length - 2, sep_id):
        block = {"input_ids": [cls_id, *ids[begin:end], sep_id]}
        if offsets:
            block["offset_mapping"] = [(0, 0), *spans[begin:end], (0, 0)]
        blocks.append(block)
    return blocks


def _block_bounds(ids: list[int], body: int, sep_id: int) -> list[tuple[int, int]]:
    """[begin, end) of each block body: ≤ `body` stream tokens, never starting or ending with [SEP]
    (the frame's [CLS] / [SEP] already mark a document's edge)."""
    bounds, begin, length = [], 0, 0
    for i, token in enumerate(ids):
        if length == 0:
            if token == sep_id:
                continue
            begin = i
        length += 1
        if length == body:
            bounds.append((begin, i if token == sep_id else i + 1))
            length = 0
    if length:
        bounds.append((begin, len(ids) - 1 if ids[-1] == sep_id else len(ids)))
    return bounds


class MLMCollator:
    """Blocks -> a masked batch {input_ids, attention_mask, labels} ((B, T) each; labels IGNORE_INDEX where
    not predicted), by transformers' DataCollatorForLanguageModeling with its own generator seeded `seed`:
    every call draws new masks, and `generator` state is what a resumed run restores."""

    def __init__(self, tokenizer, vocab_size: int, mlm_probability: float, whole_word: bool, seed: int):
        from transformers import DataCollatorForLanguageModeling

        if not 0.0 < mlm_probability < 1.0:
            raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
        if len(tokenizer) > vocab_size:  # random replacements are drawn from the whole tokenizer
            raise ValueError(f"tokenizer has {len(tokenizer)} tokens but the model only {vocab_size}")
        replace = {"mask_replace_prob": 1.0, "random_replace_prob": 0.0} if whole_word else {}  # 80/10/10 else
        self.hf = DataCollatorForLanguageModeling(tokenizer, mlm_probability=mlm_probability,
                                                  whole_word_mask=whole_word, **replace)
        # what its `seed=` builds on the first call, made here so a checkpoint can save and restore it
        self.hf.generator = torch.Generator().manual_seed(seed)
        self.whole_word, self.left = whole_word, tokenizer.padding_side == "left"
        self.special_ids = set(tokenizer.all_special_ids)

    @property
    def generator(self) -> torch.Generator:
        return self.hf.generator

    def examples(self, blocks: list[dict]) -> list[dict]:
        """The blocks as the library takes them; it pads all but offsets, padded here to the batch width."""
        if not self.whole_word:
            return [{"input_ids": b["input_ids"]} for b in blocks]
        width = max(len(b["input_ids"]) for b in blocks)
        return [{"input_ids": b["input_ids"],
                 "offset_mapping": self._pad(b["offset_mapping"], width - len(b["input_ids"]))} for b in blocks]

    def _pad(self, spans: list, n: int) -> list:
        return [(0, 0)] * n + spans if self.left else spans + [(0, 0)] * n

    def __call__(self, blocks: list[dict]) -> dict[str, torch.Tensor]:
        while True:  # an empty loss would be NaN: redraw (only a batch of a few short blocks can predict nothing)
            batch = self.hf(self.examples(blocks))
            if (batch["labels"] != IGNORE_INDEX).any():
                return {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}
            if all(t in self.special_ids for b in blocks for t in b["input_ids"]):
                raise ValueError("the blocks hold only special tokens: nothing to predict")
