import hashlib

import pytest

from headstore.data.text_id import doc_text, text_id, text_ids


def reference_text_id(text: str) -> str:
    # written out from the contract: first 16 bytes of blake2b over the UTF-8 bytes, hex
    return hashlib.new("blake2b", text.encode("utf-8")).hexdigest()[:32]


@pytest.mark.parametrize("text", ["", "a", "The cat sat.", "naïve café — 東京", "x" * 10_000, " a "])
def test_text_id_matches_reference(text):
    assert text_id(text) == reference_text_id(text)
    assert len(text_id(text)) == 32


def test_text_id_distinguishes_whitespace_and_case():
    ids = {text_id(t) for t in ["abc", "abc ", " abc", "ABC", "abc\n"]}
    assert len(ids) == 5


def test_text_ids_equals_elementwise():
    texts = ["one", "two", "", "one", "ünïcode"]
    assert text_ids(texts) == [text_id(t) for t in texts]
    assert text_ids([]) == []


def test_text_ids_rejects_non_strings_naming_the_item():
    with pytest.raises(TypeError, match="item 1"):
        text_ids(["ok", 3, "ok"])
    with pytest.raises(TypeError):
        text_id(None)


@pytest.mark.parametrize("title, text, expected", [
    ("Title", "Body text.", "Title Body text."),
    ("", "Body only", "Body only"),
    ("Title only", "", "Title only"),
    ("", "", ""),
    ("  T ", " b  ", "T   b"),
])
def test_doc_text(title, text, expected):
    assert doc_text(title, text) == expected
