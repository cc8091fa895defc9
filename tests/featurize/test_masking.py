"""BERT masking statistics, special-token safety, whole-word groups, and text packing."""
from __future__ import annotations

import torch
from transformers import BertTokenizerFast

from headstore.featurize.tuning.masking import IGNORE_INDEX, MaskingVocab, mask_tokens, wordpiece_word_ids
from headstore.featurize.tuning.packing import MLMCollator, pack_texts, split_holdout

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "cell", "protein", "gene", "binds", "to", "a", "in", "of", "and", "mouse",
         "human", "is", "expressed", "tumor", "brain", "blood", "with", "we", "found"]
PIECES = ["un", "##bind", "##ing", "##ed", "pro", "##tein", "##s", "."]


def make_tokenizer(tmp_path) -> BertTokenizerFast:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(SPECIALS + WORDS + PIECES) + "\n")
    return BertTokenizerFast(vocab=str(vocab), do_lower_case=True)


def random_batch(tok, rows=64, width=40, seed=0):
    """Rows of random ordinary ids framed by [CLS]/[SEP], with random-length padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(len(SPECIALS), len(tok), (rows, width), generator=g)
    lengths = torch.randint(5, width + 1, (rows,), generator=g)
    attention = (torch.arange(width)[None, :] < lengths[:, None]).long()
    ids[:, 0] = tok.cls_token_id
    ids[torch.arange(rows), lengths - 1] = tok.sep_token_id
    ids[attention == 0] = tok.pad_token_id
    special = torch.isin(ids, torch.tensor(tok.all_special_ids)) | (attention == 0)
    return ids, special, attention


def test_80_10_10_split_and_rate(tmp_path):
    tok = make_tokenizer(tmp_path)
    vocab = MaskingVocab.from_tokenizer(tok)
    ids, special, attention = random_batch(tok, rows=400, width=64)
    masked, labels = mask_tokens(ids, special, attention, vocab, len(tok),
                                 torch.Generator().manual_seed(1), mlm_probability=0.15)
    selected = labels != IGNORE_INDEX
    n_candidates = int((~special).sum())
    assert abs(selected.sum().item() / n_candidates - 0.15) < 0.01
    assert torch.equal(labels[selected], ids[selected])  # labels are the original tokens
    n = selected.sum().item()
    to_mask = (masked == tok.mask_token_id) & selected
    changed = (masked != ids) & selected & ~to_mask
    kept = (masked == ids) & selected
    assert abs(to_mask.sum().item() / n - 0.8) < 0.03
    # a random replacement equals the original 1/V of the time; those count as "kept"
    assert abs((changed.sum().item() + kept.sum().item()) / n - 0.2) < 0.03
    assert abs(changed.sum().item() / n - 0.1 * (1 - 1 / (len(tok) - len(SPECIALS)))) < 0.02
    # random replacements never produce a special token
    assert not torch.isin(masked[changed], torch.tensor(tok.all_special_ids)).any()
    # unselected positions are untouched
    assert torch.equal(masked[~selected], ids[~selected])


def test_special_tokens_and_padding_never_masked(tmp_path):
    tok = make_tokenizer(tmp_path)
    vocab = MaskingVocab.from_tokenizer(tok)
    ids, special, attention = random_batch(tok, rows=100, width=30, seed=3)
    for seed in range(5):
        for whole_word in (False, True):
            masked, labels = mask_tokens(ids, special, attention, vocab, len(tok),
                                         torch.Generator().manual_seed(seed), 0.5, whole_word)
            assert (labels[special] == IGNORE_INDEX).all()
            assert torch.equal(masked[special], ids[special])


def test_fresh_masks_per_call_and_seeded(tmp_path):
    tok = make_tokenizer(tmp_path)
    vocab = MaskingVocab.from_tokenizer(tok)
    ids, special, attention = random_batch(tok)
    g = torch.Generator().manual_seed(7)
    first = mask_tokens(ids, special, attention, vocab, len(tok), g)[1]
    second = mask_tokens(ids, special, attention, vocab, len(tok), g)[1]
    assert not torch.equal(first, second)  # a new draw each batch
    again = mask_tokens(ids, special, attention, vocab, len(tok), torch.Generator().manual_seed(7))[1]
    assert torch.equal(first, again)


def test_wordpiece_word_ids_by_hand(tmp_path):
    tok = make_tokenizer(tmp_path)
    enc = tok(["the protein unbinding proteins", "unbinding"], padding=True, return_tensors="pt")
    tokens = tok.convert_ids_to_tokens(enc["input_ids"][0])
    assert tokens == ["[CLS]", "the", "protein", "un", "##bind", "##ing", "protein", "##s", "[SEP]"]
    vocab = MaskingVocab.from_tokenizer(tok)
    special = torch.isin(enc["input_ids"], torch.tensor(tok.all_special_ids))
    words = wordpiece_word_ids(enc["input_ids"], special, torch.tensor(vocab.is_continuation))
    assert words[0].tolist() == [-1, 0, 1, 2, 2, 2, 3, 3, -1]
    assert words[1].tolist() == [-1, 0, 0, 0, -1, -1, -1, -1, -1]


def test_whole_word_groups_masked_together(tmp_path):
    tok = make_tokenizer(tmp_path)
    vocab = MaskingVocab.from_tokenizer(tok)
    text = " ".join(["the unbinding of proteins and unbinding in brain"] * 6)
    enc = tok([text] * 50, return_tensors="pt")
    ids, attention = enc["input_ids"], enc["attention_mask"]
    special = torch.isin(ids, torch.tensor(tok.all_special_ids))
    words = wordpiece_word_ids(ids, special, torch.tensor(vocab.is_continuation))
    masked, labels = mask_tokens(ids, special, attention, vocab, len(tok),
                                 torch.Generator().manual_seed(0), 0.15, whole_word=True)
    selected = labels != IGNORE_INDEX
    for row in range(ids.shape[0]):
        for w in words[row].unique().tolist():
            if w < 0:
                continue
            group = selected[row][words[row] == w]
            assert group.all() or not group.any()  # all pieces of a word or none
    rate = selected.sum().item() / (~special).sum().item()
    assert 0.10 < rate < 0.20
    # explicit word_ids: pairs of positions form words
    pairs = torch.where(special, torch.full_like(ids, -1), torch.arange(ids.shape[1]) // 2)
    _, labels = mask_tokens(ids, special, attention, vocab, len(tok),
                            torch.Generator().manual_seed(1), 0.3, whole_word=True, word_ids=pairs)
    sel = labels != IGNORE_INDEX
    last = ids.shape[1] - 2  # the last maskable position ([SEP] follows)
    for p in range(2, last, 2):  # positions 2k and 2k+1 form word k
        assert torch.equal(sel[:, p], sel[:, p + 1])
    assert sel.any()


def test_every_row_gets_a_prediction(tmp_path):
    tok = make_tokenizer(tmp_path)
    vocab = MaskingVocab.from_tokenizer(tok)
    enc = tok(["the cell"] * 200, return_tensors="pt")  # 2 maskable tokens per row
    special = torch.isin(enc["input_ids"], torch.tensor(tok.all_special_ids))
    _, labels = mask_tokens(enc["input_ids"], special, enc["attention_mask"], vocab, len(tok),
                            torch.Generator().manual_seed(0))
    assert ((labels != IGNORE_INDEX).sum(dim=1) >= 1).all()


def test_pack_texts_frames_blocks(tmp_path):
    tok = make_tokenizer(tmp_path)
    texts = ["the cell binds to a protein", "", "we found the gene in mouse brain",
             "human blood"] * 5
    blocks = pack_texts(texts, tok, max_length=10)
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


def test_collator_pads_and_masks(tmp_path):
    tok = make_tokenizer(tmp_path)
    collate = MLMCollator(tok, len(tok), 0.15, whole_word=False)
    batch = collate([[2, 5, 6, 7, 3], [2, 8, 3]], torch.Generator().manual_seed(0))
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert batch.input_ids[1, 3:].tolist() == [tok.pad_token_id] * 2
    assert (batch.labels[:, 0] == IGNORE_INDEX).all() and (batch.labels[1, 2:] == IGNORE_INDEX).all()


def test_split_holdout_is_stable():
    texts = [f"passage number {i}" for i in range(2000)]
    train, held = split_holdout(texts, 0.1)
    assert len(train) + len(held) == 2000 and 150 < len(held) < 250
    assert split_holdout(list(reversed(texts)), 0.1)[1] == list(reversed(held))
