"""Tiny random encoders of several architectures, each saved as a sentence-transformers directory.

Every model is built from a config with tiny sizes and a tokenizer made here from `featurize_helpers.WORDS`
(no download): WordPiece (lower-casing, BERT-style [CLS]/[SEP]) for BERT, DistilBERT and ELECTRA; a cased
word-level vocabulary with RoBERTa-style <s>/</s> and pad id 1 for RoBERTa, XLM-RoBERTa, MPNet (whose
positions start after the padding index) and DeBERTa-v2; ModernBERT where transformers has it.
"""
from __future__ import annotations

from pathlib import Path

from featurize_helpers import WORDS

MAX_LENGTH = 24
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48)


def _tokenizer(folder: Path, style: str):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if style == "bert":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        cls, sep, pad, unk, mask = "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"
    else:  # RoBERTa-style ids: <s>=0, <pad>=1, </s>=2, <unk>=3
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        cls, sep, pad, unk, mask = "<s>", "</s>", "<pad>", "<unk>", "<mask>"
    words = [*WORDS, *(w.capitalize() for w in WORDS), *"0123456789"]
    vocab = {t: i for i, t in enumerate([*specials, *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    if style == "bert":
        tok.normalizer = normalizers.Lowercase()  # an uncased model: "Cat" and "cat" are one token
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(True)])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B {sep}",
        special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=MAX_LENGTH, cls_token=cls,
                                   sep_token=sep, pad_token=pad, unk_token=unk, mask_token=mask,
                                   bos_token=cls, eos_token=sep)
    fast.save_pretrained(folder)
    return fast, len(vocab), vocab[pad]


def _config(arch: str, vocab_size: int, pad_id: int):
    import transformers as tf

    common = dict(vocab_size=vocab_size, pad_token_id=pad_id, max_position_embeddings=64, **SIZES)
    if arch == "bert":
        return tf.BertConfig(**common), tf.BertModel
    if arch == "roberta":
        return tf.RobertaConfig(**{**common, "max_position_embeddings": 40}), tf.RobertaModel
    if arch == "xlm-roberta":
        return tf.XLMRobertaConfig(**{**common, "max_position_embeddings": 40}), tf.XLMRobertaModel
    if arch == "mpnet":
        return tf.MPNetConfig(**common), tf.MPNetModel
    if arch == "electra":
        return tf.ElectraConfig(**common, embedding_size=16), tf.ElectraModel
    if arch == "deberta-v2":
        return tf.DebertaV2Config(**common, relative_attention=True, position_buckets=8,
                                  pos_att_type=["p2c", "c2p"], position_biased_input=False), tf.DebertaV2Model
    if arch == "distilbert":
        return tf.DistilBertConfig(vocab_size=vocab_size, pad_token_id=pad_id, max_position_embeddings=64,
                                   dim=32, n_layers=2, n_heads=2, hidden_dim=48), tf.DistilBertModel
    if arch == "modernbert":
        return tf.ModernBertConfig(**common, global_attn_every_n_layers=1, local_attention=16, bos_token_id=0,
                                   eos_token_id=2, cls_token_id=0, sep_token_id=2), tf.ModernBertModel
    raise ValueError(arch)


ARCHES = ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra", "deberta-v2", "modernbert")
STYLE = {"bert": "bert", "distilbert": "bert", "electra": "bert"}


def has_arch(arch: str) -> bool:
    import transformers

    return arch != "modernbert" or hasattr(transformers, "ModernBertModel")


def build_hf(folder: Path, arch: str, seed: int = 0) -> Path:
    """A tiny random `arch` encoder and its tokenizer, saved (safetensors) as a plain HF checkpoint."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    _, vocab_size, pad_id = _tokenizer(folder, STYLE.get(arch, "roberta"))
    config, model_class = _config(arch, vocab_size, pad_id)
    torch.manual_seed(seed)
    model_class(config).eval().save_pretrained(folder, safe_serialization=True)
    return folder


def build_st(folder: Path, hf_dir: Path, modes, dense: int | None = None, normalize: bool = False,
             include_prompt: bool = True, prompts: dict | None = None, seed: int = 0) -> Path:
    """A sentence-transformers directory: Transformer(hf_dir), Pooling(modes), optional Dense(-> dense, tanh),
    optional Normalize."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    transformer = Transformer(str(hf_dir), max_seq_length=MAX_LENGTH)
    dim = transformer.get_embedding_dimension()
    modules = [transformer, Pooling(dim, pooling_mode=modes, include_prompt=include_prompt)]
    if dense:
        torch.manual_seed(seed + 1)
        modules.append(Dense(modules[1].get_embedding_dimension(), dense, activation_function=torch.nn.Tanh()))
    if normalize:
        modules.append(Normalize())
    model = SentenceTransformer(modules=modules, device="cpu", prompts=prompts or {})
    model.save(str(folder), create_model_card=False)
    return folder
