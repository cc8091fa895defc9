"""BERT-style dynamic masking for masked-language-model training.

Masks are drawn afresh every time `mask_tokens` is called (the collator calls it per batch), so the
same block sees different masks in different epochs. Of the positions selected for prediction
(`mlm_probability` of the real tokens), 80% become [MASK], 10% a random ordinary token, 10% stay.
Special tokens ([CLS], [SEP], [PAD], ...) and padding are never selected.

Whole-word masking selects words instead of word pieces: every piece of a selected word is
predicted. Word membership comes from `word_ids` (per token, -1 for tokens outside any word) or,
for WordPiece vocabularies, from the `##` continuation prefix (`wordpiece_word_ids`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE_INDEX = -100  # label value the MLM loss skips (torch cross_entropy's default ignore_index)
MASK_FRACTION = 0.8  # of selected positions → [MASK] (BERT, Devlin et al. 2019)
RANDOM_FRACTION = 0.1  # of selected positions → random token; the remaining 0.1 keep their token


@dataclass(frozen=True)
class MaskingVocab:
    """What masking needs to know about a tokenizer."""

    mask_token_id: int
    special_ids: tuple[int, ...]  # never used as random replacements
    is_continuation: tuple[bool, ...] | None  # per vocab id: WordPiece `##` piece (None: not WordPiece)

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "MaskingVocab":
        if tokenizer.mask_token_id is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has no mask token; MLM needs one")
        vocab = tokenizer.get_vocab()  # token → id
        size = max(len(tokenizer), max(vocab.values()) + 1)
        is_cont = [False] * size
        for token, idx in vocab.items():
            is_cont[idx] = token.startswith("##")
        special = tuple(sorted(set(tokenizer.all_special_ids)))
        return cls(int(tokenizer.mask_token_id), special, tuple(is_cont) if any(is_cont) else None)

    def replacement_ids(self, vocab_size: int) -> torch.Tensor:
        """Ids a random replacement may take: every id that is not a special token."""
        allowed = torch.ones(vocab_size, dtype=torch.bool)
        allowed[list(s for s in self.special_ids if s < vocab_size)] = False
        return allowed.nonzero().squeeze(1)  # (V',)


def wordpiece_word_ids(input_ids: torch.Tensor, special_tokens_mask: torch.Tensor,
                       is_continuation: torch.Tensor) -> torch.Tensor:
    """Word index per token from WordPiece `##` pieces; -1 for special/padding tokens.

    input_ids, special_tokens_mask: (B, T); is_continuation: (V,) bool. A word starts at every
    non-special token that is not a `##` piece; a `##` piece joins the word before it.
    """
    special = special_tokens_mask.bool()
    # a `##` piece right after a special token (a block cut mid-word) starts a word of its own,
    # so it is never glued to the word before the special token
    after_special = torch.zeros_like(special)
    after_special[:, 1:] = special[:, :-1]
    after_special[:, 0] = True  # the first token of a row always starts a word
    starts = (~is_continuation[input_ids] | after_special) & ~special  # (B, T)
    word = starts.long().cumsum(dim=1) - 1  # (B, T) index of the latest word start in the row
    return torch.where(special, torch.full_like(word, -1), word)


def _select_words(word_ids: torch.Tensor, probability: float, generator: torch.Generator) -> torch.Tensor:
    """Select each word (per row) with `probability`; return the token-level selection (B, T)."""
    n_words = int(word_ids.max().item()) + 1 if word_ids.numel() else 0
    if n_words <= 0:
        return torch.zeros_like(word_ids, dtype=torch.bool)
    chosen = torch.rand((word_ids.shape[0], n_words), generator=generator) < probability  # (B, W)
    safe = word_ids.clamp(min=0)
    return chosen.gather(1, safe) & (word_ids >= 0)  # (B, T)


def mask_tokens(input_ids: torch.Tensor, special_tokens_mask: torch.Tensor,
                attention_mask: torch.Tensor, vocab: MaskingVocab, vocab_size: int,
                generator: torch.Generator, mlm_probability: float = 0.15,
                whole_word: bool = False, word_ids: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply BERT masking to a batch; return (masked input_ids, labels), both (B, T) long.

    labels hold the original id at predicted positions and IGNORE_INDEX elsewhere. Every row with
    at least one maskable token gets at least one prediction (so no batch has an empty loss).
    The generator lives on the CPU; results are moved to input_ids' device.
    """
    if not 0.0 < mlm_probability < 1.0:
        raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
    device = input_ids.device
    ids = input_ids.cpu()
    candidate = (~special_tokens_mask.cpu().bool()) & attention_mask.cpu().bool()  # (B, T)

    if whole_word:
        if word_ids is None:
            if vocab.is_continuation is None:
                raise ValueError("whole_word masking needs word_ids or a WordPiece (`##`) vocabulary")
            is_cont = torch.tensor(vocab.is_continuation, dtype=torch.bool)
            word_ids = wordpiece_word_ids(ids, ~candidate, is_cont)
        word_ids = torch.where(candidate, word_ids.cpu().long(), torch.full_like(ids, -1))
        selected = _select_words(word_ids, mlm_probability, generator)
    else:
        selected = (torch.rand(ids.shape, generator=generator) < mlm_probability) & candidate

    # rows with candidates but no selection: select one random candidate (a whole word if whole_word)
    empty = (~selected.any(dim=1)) & candidate.any(dim=1)  # (B,)
    if empty.any():
        noise = torch.rand(ids.shape, generator=generator).masked_fill(~candidate, -1.0)
        pick = noise.argmax(dim=1)  # (B,)
        forced = torch.zeros_like(selected)
        forced[torch.arange(ids.shape[0]), pick] = True
        if whole_word:
            picked_word = word_ids.gather(1, pick[:, None])  # (B, 1)
            forced = (word_ids == picked_word) & candidate
        selected = selected | (forced & empty[:, None])

    labels = torch.where(selected, ids, torch.full_like(ids, IGNORE_INDEX))
    roll = torch.rand(ids.shape, generator=generator)  # one draw decides mask / random / keep
    to_mask = selected & (roll < MASK_FRACTION)
    to_random = selected & (roll >= MASK_FRACTION) & (roll < MASK_FRACTION + RANDOM_FRACTION)
    masked = ids.clone()
    masked[to_mask] = vocab.mask_token_id
    allowed = vocab.replacement_ids(vocab_size)  # (V',)
    n_random = int(to_random.sum())
    if n_random:
        pick = torch.randint(len(allowed), (n_random,), generator=generator)
        masked[to_random] = allowed[pick]
    return masked.to(device), labels.to(device)
