"""MLM batches: transformers' masking (rate, 80/10/10, special tokens, whole words) as packing.MLMCollator
uses it, and the packing of texts into blocks."""
from __future__ import annotations

import pytest
import torch
from transformers import BertTokenizerFast

from headstore.featurize.tuning.packing import IGNORE_INDEX, MLMCollator, pack_texts, split_holdout

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "cell", "protein", "gene", "binds", "to", "a", "in", "of", "and", "mouse",
         "human", "is", "expressed", "tumor", "brain", "blood", "with", "we", "found"]
PIECES = ["un", "##bind", "##ing", "##ed", "pro", "##tein", "##s", "."]


def make_tokenizer(tmp_path) -> BertTokenizerFast:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(SPECIALS + WORDS + PIECES) + "\n")
    return BertTokenizerFast(vocab=str(vocab), do_lower_case=True)


def collator(tok, probability=0.15, whole_word=False, seed=0) -> MLMCollator:
    return MLMCollator(tok, len(tok), probability, whole_word, seed=seed)


def random_blocks(tok, rows=64, width=40, seed=0) -> list[dict]:
    """Blocks of random ordinary ids framed by [CLS]/[SEP], of random lengths (the collator pads them)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, width - 1, (rows,), generator=g).tolist()
    return [{"input_ids": [tok.cls_token_id, *torch.randint(len(SPECIALS), len(tok), (n,), generator=g).tolist(),
                           tok.sep_token_id]} for n in lengths]


def padded(tok, blocks) -> torch.Tensor:
    width = max(len(b["input_ids"]) for b in blocks)
    return torch.tensor([b["input_ids"] + [tok.pad_token_id] * (width - len(b["input_ids"])) for b in blocks])


def test_rate_and_80_10_10_split(tmp_path):
    tok = make_tokenizer(tmp_path)
    blocks = random_blocks(tok, rows=400, width=64)
    ids = padded(tok, blocks)
    batch = collator(tok)(blocks)
    masked, labels = batch["input_ids"], batch["labels"]
    special = torch.isin(ids, torch.tensor(tok.all_special_ids))
    selected = labels != IGNORE_INDEX
    assert abs(selected.sum().item() / (~special).sum().item() - 0.15) < 0.01
    assert torch.equal(labels[selected], ids[selected])  # labels are the original tokens
    assert torch.equal(masked[~selected], ids[~selected])  # unselected positions are untouched
    n, vocab = selected.sum().item(), len(tok)  # a random replacement is drawn from the whole vocabulary
    to_mask = ((masked == tok.mask_token_id) & selected).sum().item() / n
    changed = ((masked != ids) & (masked != tok.mask_token_id) & selected).sum().item() / n
    kept = ((masked == ids) & selected).sum().item() / n
    assert abs(to_mask - (0.8 + 0.1 / vocab)) < 0.03
    assert abs(changed - 0.1 * (1 - 2 / vocab)) < 0.02
    assert abs(kept - (0.1 + 0.1 / vocab)) < 0.02
    assert batch["attention_mask"].tolist() == (ids != tok.pad_token_id).long().tolist()


def test_special_tokens_and_padding_never_masked(tmp_path):
    tok = make_tokenizer(tmp_path)
    text = " ".join(["the unbinding of proteins and unbinding in brain"] * 3)
    for whole_word in (False, True):
        blocks = pack_texts([text] * 20 + ["the cell"], tok, max_length=30, offsets=whole_word)
        ids = padded(tok, blocks)
        special = torch.isin(ids, torch.tensor(tok.all_special_ids))
        collate = collator(tok, 0.5, whole_word)
        for _ in range(5):
            batch = collate(blocks)
            assert (batch["labels"][special] == IGNORE_INDEX).all()
            assert torch.equal(batch["input_ids"][special], ids[special])


def test_fresh_masks_per_call_and_seeded(tmp_path):
    tok = make_tokenizer(tmp_path)
    blocks = random_blocks(tok)
    collate = collator(tok, seed=7)
    first, second = collate(blocks)["labels"], collate(blocks)["labels"]
    assert not torch.equal(first, second)  # a new draw each batch
    assert torch.equal(first, collator(tok, seed=7)(blocks)["labels"])
    state = collate.generator.get_state()  # what a checkpoint saves: the next draw is the same again
    third = collate(blocks)["labels"]
    collate.generator.set_state(state)
    assert torch.equal(collate(blocks)["labels"], third)


def test_whole_word_groups_masked_together(tmp_path):
    tok = make_tokenizer(tmp_path)
    text = " ".join(["the unbinding of proteins and unbinding in brain"] * 6)
    blocks = pack_texts([text] * 50, tok, max_length=24, offsets=True)
    ids = padded(tok, blocks)
    batch = collator(tok, 0.15, whole_word=True)(blocks)
    selected = batch["labels"] != IGNORE_INDEX
    special = torch.isin(ids, torch.tensor(tok.all_special_ids))
    piece = torch.tensor([t.startswith("##") for t in tok.convert_ids_to_tokens(range(len(tok)))])[ids]
    joins = piece.clone()  # a `##` piece joins the word before it, unless a special token precedes it
    joins[:, 1:] &= ~special[:, :-1]
    joins[:, 0] = False
    prev = torch.zeros_like(selected)
    prev[:, 1:] = selected[:, :-1]
    assert torch.equal(selected[joins], prev[joins])  # all pieces of a word or none
    assert (batch["input_ids"][selected] == tok.mask_token_id).all()  # whole words: all [MASK]
    starts = ~special & ~joins
    assert 0.12 < selected[starts].float().mean().item() < 0.18  # words are selected at the rate
    assert selected[piece & ~special].any()  # multi-piece words were selected whole


def test_a_batch_always_predicts_something(tmp_path):
    tok = make_tokenizer(tmp_path)
    collate = collator(tok, probability=0.05, seed=3)
    for _ in range(5):  # one maskable token at 5%: the collator redraws until it is picked
        assert (collate([{"input_ids": [tok.cls_token_id, 9, tok.sep_token_id]}])["labels"] != IGNORE_INDEX).any()
    with pytest.raises(ValueError, match="only special tokens"):
        collate([{"input_ids": [tok.cls_token_id, tok.sep_token_id]}])
    with pytest.raises(ValueError, match="only 10"):
        MLMCollator(tok, 10, 0.15, False, seed=0)  # random replacements must be ids the model has


def test_pack_texts_frames_blocks(tmp_path):
    tok = make_tokenizer(tmp_path)
    texts = ["the cell binds to a protein", "", "we found the gene in mouse brain",
             "human blood"] * 5
    blocks = [b["input_ids"] for b in pack_texts(texts, tok, max_length=10)]
    assert all(b[0] == tok.cls_token_id and b[-1] == tok.sep_token_id for b in blocks)
    assert all(len(b) <= 10 for b in blocks)
    # only the last block is short (a block whose body ends a document drops that [SEP]: 9)
    assert all(len(b) in (9, 10) for b in blocks[:-1])
    assert sum(len(b) == 10 for b in blocks) > len(blocks) // 2
    # the documents' tokens, in order, with nothing lost or added
    sep = tok.sep_token_id
    content = [t for b in blocks for t in b[1:-1] if t != sep]
    expected = [t for text in texts for t in tok(text, add_special_tokens=False)["input_ids"]]
    assert content == expected
    # documents inside a block are separated by one [SEP]; bodies never start or end with one
    n_docs = sum(1 for t in texts if t)
    inner = sum(t == sep for b in blocks for t in b[1:-1])
    assert all(b[1] != sep and b[-2] != sep for b in blocks)
    assert n_docs - len(blocks) <= inner <= n_docs - 1


def test_pack_texts_keeps_offsets_beside_the_ids(tmp_path):
    tok = make_tokenizer(tmp_path)
    texts = ["the protein unbinding proteins", "unbinding"]
    (block,) = pack_texts(texts, tok, max_length=20, offsets=True)
    assert tok.convert_ids_to_tokens(block["input_ids"]) == [
        "[CLS]", "the", "protein", "un", "##bind", "##ing", "protein", "##s", "[SEP]", "un", "##bind", "##ing", "[SEP]"]
    assert block["offset_mapping"] == [(0, 0), (0, 3), (4, 11), (12, 14), (14, 18), (18, 21), (22, 29), (29, 30),
                                       (0, 0), (0, 2), (2, 6), (6, 9), (0, 0)]
    cut = pack_texts(texts, tok, max_length=6, offsets=True)  # blocks cut mid-word keep the two aligned
    assert [len(b["input_ids"]) for b in cut] == [len(b["offset_mapping"]) for b in cut]
    assert "offset_mapping" not in pack_texts(texts, tok, max_length=6)[0]


def test_split_holdout_is_stable():
    texts = [f"passage number {i}" for i in range(2000)]
    train, held = split_holdout(texts, 0.1)
    assert len(train) + len(held) == 2000 and 150 < len(held) < 250
    assert split_holdout(list(reversed(texts)), 0.1)[1] == list(reversed(held))
