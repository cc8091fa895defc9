"""What bench/speed/featurize.py measures on: the text sets, the model shapes, the FLOPs count and the fp32 reference.

Text sets (read with headstore's own dataset readers, as `cli featurize --data ...` reads them):
  main        every text of the main job (examples/end_to_end.sh: scifact, stsb, cranfield, cacm,
              semeval-sts-2012-2016, pairs-small/trecqa_pairs.parquet), deduplicated as the store does
              (36,371 texts), at the model's max length (256 for MiniLM)
  scifact512  the SciFact corpus (title + " " + text), 5,183 texts, at 512 tokens
`--limit N` keeps N texts evenly spaced over the length order, so a cut set keeps the real length mix.

Shapes: minilm (the offline weights, or --model DIR), bert-base and bert-large: random weights from a
BertConfig saved as a local model dir with MiniLM's tokenizer (throughput does not depend on the values).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

MAIN_JOB_DATA = ("scifact", "stsb", "cranfield", "cacm", "semeval-sts-2012-2016", "pairs-small/trecqa_pairs.parquet")
TEXT_SETS = ("main", "scifact512")
# L layers, H hidden, I intermediate, A heads (BERT-base and BERT-large of Devlin et al. 2019)
SHAPES = {"minilm": None, "bert-base": (12, 768, 3072, 12), "bert-large": (24, 1024, 4096, 16)}


def read_text_set(name: str, data_root: Path) -> list[str]:
    """The texts of a text set, unique, in input order (as a store rows them: no prompts for these models)."""
    from headstore.featurize.run.source import all_chunks, open_sources

    if name not in TEXT_SETS:
        raise ValueError(f"text set {name!r} not valid; choose one of {list(TEXT_SETS)}")
    paths = [data_root / p for p in (MAIN_JOB_DATA if name == "main" else ("scifact",))]
    roles = None if name == "main" else {"document"}  # scifact512: the corpus, not the queries
    texts = [t for role, chunk in all_chunks(open_sources(paths, None)) if roles is None or role in roles
             for t in chunk]
    return list(dict.fromkeys(texts))


def text_set_length(name: str, model_max_length: int, position_limit: int | None = None) -> int:
    """Tokens per text: the model's own max for main, 512 for scifact512 (or the model's position limit,
    for a tiny test model)."""
    return model_max_length if name == "main" else min(512, position_limit or 512)


def spread(n_tokens: np.ndarray, k: int | None) -> np.ndarray:
    """Indices (ascending) of k texts evenly spaced over the length order: the cut keeps the length mix."""
    n = len(n_tokens)
    if not k or k >= n:
        return np.arange(n)
    by_length = np.argsort(n_tokens, kind="stable")
    return np.sort(by_length[np.unique(np.linspace(0, n - 1, k).round().astype(np.int64))])


def tokenizer_counts(model_dir: str, texts: list[str], max_length: int) -> tuple[np.ndarray, float]:
    """(n_tokens per text, tokens/s of headstore's tokenizer alone on these texts, one call)."""
    from transformers import AutoTokenizer

    from headstore.featurize.encoder.encode import tokenize

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    t0 = time.perf_counter()
    n_tokens = tokenize(tokenizer, texts, max_length).n_tokens
    return n_tokens, float(n_tokens.sum()) / max(time.perf_counter() - t0, 1e-9)


def make_shape(shape: str, minilm_dir: str, folder: Path) -> str:
    """The model dir of a shape: MiniLM itself, else a random BERT of that shape with MiniLM's tokenizer."""
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r} not valid; choose one of {sorted(SHAPES)}")
    if SHAPES[shape] is None:
        return minilm_dir
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    layers, hidden, inter, heads = SHAPES[shape]
    out = folder / shape
    if (out / "model.safetensors").is_file():
        return str(out)
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        intermediate_size=inter, num_attention_heads=heads, max_position_embeddings=512)
    torch.manual_seed(0)
    BertModel(config, add_pooling_layer=False).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return str(out)


def flops_per_text(model_dir: str, n_tokens: np.ndarray) -> np.ndarray:
    """Useful forward FLOPs of each text: 2 L (4 H^2 + 2 H I) per token (projections and FFN, multiply-add
    = 2) + 4 L n H per token (QK^T and attention x V over the text's own n tokens); embeddings, LayerNorm,
    softmax and pooling left out; padding is waste, not counted."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    L, H = int(config["num_hidden_layers"]), int(config["hidden_size"])
    inter = int(config.get("intermediate_size", 4 * H))
    n = np.asarray(n_tokens, dtype=np.float64)
    return n * (2 * L * (4 * H * H + 2 * H * inter)) + 4 * L * H * n * n


def st_padded_tokens(texts: list[str], n_tokens: np.ndarray, batch_size: int) -> int:
    """Padded tokens of sentence-transformers' plan: sorted by character length (longest first), cut every
    batch_size texts, each batch padded to its longest."""
    order = np.argsort([-len(t) for t in texts], kind="stable")
    return int(sum(len(idx) * n_tokens[idx].max()
                   for idx in (order[a:a + batch_size] for a in range(0, len(order), batch_size))))


def reference(model_dir: str, texts: list[str], max_length: int, device: str, batch: int = 16) -> np.ndarray:
    """The fp32 reference: plain transformers, eager attention, padded batches of similar length, mask-aware
    mean pooling, on `device` (no TF32), unit rows (N, D). Every model here pools by the mask-aware mean
    (MiniLM's modules: mean + Normalize; the random shapes: mean), so unit rows compare across systems."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, use_safetensors=True, attn_implementation="eager",
                                      dtype=torch.float32).to(device).eval()
    order = np.argsort([len(t) for t in texts], kind="stable")
    out = np.zeros((len(texts), model.config.hidden_size), dtype=np.float32)
    with torch.inference_mode():
        for a in range(0, len(texts), batch):
            idx = order[a:a + batch]
            enc = tok([texts[i] for i in idx], truncation=True, max_length=max_length, padding=True,
                      return_tensors="pt").to(device)
            hidden = model(**enc).last_hidden_state.float()  # (B, S, D)
            mask = enc["attention_mask"].unsqueeze(-1).float()  # (B, S, 1)
            out[idx] = ((hidden * mask).sum(1) / mask.sum(1)).cpu().numpy()
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return unit_rows(out)


def unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def max_abs_diff(features: np.ndarray | None, ref: np.ndarray) -> float | None:
    """max |a - b| of unit rows; None when a run kept no features."""
    if features is None or len(features) != len(ref):
        return None
    return float(np.abs(unit_rows(features) - ref).max())
