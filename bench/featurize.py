"""Benchmark: headstore featurize vs sentence-transformers `encode`, same model, texts, pooling.

    python bench/featurize.py --limit 2000 --json runs/bench-featurize.json

Texts: the SciFact corpus (title + " " + text) and the STS-B sentences (deduplicated), subsampled
with --limit. Each side runs at each of a few batch settings and reports its best. Reports texts/s,
real (non-padding) tokens/s, the ratio, and the max abs difference of each side's features from a
plain transformers mean-pooling reference on a sample of texts.

On GPU it also measures real tokens/s of a random-weight BERT-base-shaped model at 128 tokens as a
fraction of the bf16 peak (--peak-tflops, 989 for an H100 SXM), counting forward FLOPs per token as
    2 * L * 12 * H^2          (Q, K, V, output projections 4H^2 + FFN 2*H*4H, multiply-add = 2)
  + 4 * L * S * H             (QK^T and attention-times-V: 2*S*H each, per token per layer)
with L layers, hidden H, sequence length S (embeddings, LayerNorm, softmax and pooling left out).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data.readers import read_beir, read_sts  # noqa: E402
from data.text_id import doc_text, text_ids  # noqa: E402
from featurize.config import FeaturizeConfig  # noqa: E402
from featurize.model import model_identity, resolve_model  # noqa: E402
from featurize.run import featurize_texts  # noqa: E402
from featurize.store import FeatureStore  # noqa: E402


def load_texts(data_root: Path, limit: int | None, seed: int = 0) -> list[str]:
    corpus = read_beir(data_root / "scifact").corpus
    texts = [doc_text(t, x) for t, x in zip(corpus["title"], corpus["text"])]
    sts = read_sts(data_root / "stsb" / "stsb.parquet")
    texts += sts["sentence1"].to_list() + sts["sentence2"].to_list()
    texts = list(dict.fromkeys(texts))  # dedupe, keep order
    if limit and limit < len(texts):
        texts = random.Random(seed).sample(texts, limit)
    return texts


def reference(model_dir: str, texts: list[str], max_length: int) -> np.ndarray:
    """Plain transformers mean pooling, one text at a time (no padding), float32 on CPU."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, use_safetensors=True,
                                      attn_implementation="eager").eval()
    out = []
    with torch.inference_mode():
        for text in texts:
            enc = tok([text], truncation=True, max_length=max_length, return_tensors="pt")
            out.append(model(**enc).last_hidden_state[0].mean(0).numpy())
    return np.stack(out)


def run_headstore(model: str, texts: list[str], batch_tokens: int, device: str, ref_texts,
                  dtype: str = "float32", max_length: int | None = None) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="bench-store-"))
    try:
        config = FeaturizeConfig(model=model, dtype=dtype, batch_tokens=batch_tokens, device=device,
                                 max_length=max_length)
        summary = featurize_texts(config, texts, folder / "s")
        store = FeatureStore.open(folder / "s")
        feats = store.features()[store.rows_for(text_ids(ref_texts))] if ref_texts else None
    finally:
        shutil.rmtree(folder)
    return {"batch_tokens": batch_tokens, "seconds": summary["encode_seconds"],
            "real_tokens": summary["real_tokens"], "features": feats,
            "n_truncated": summary["n_truncated"]}


def run_st(model_dir: str, texts: list[str], batch_size: int, device: str, ref_texts,
           max_length: int) -> dict:
    from sentence_transformers import SentenceTransformer, models

    module = models.Transformer(model_dir, max_seq_length=max_length)
    pooling = models.Pooling((getattr(module, "get_embedding_dimension", None) or module.get_word_embedding_dimension)(), pooling_mode="mean")
    st = SentenceTransformer(modules=[module, pooling], device=device)  # no Normalize: same pooling
    st.encode(texts[:8], batch_size=8)  # warm-up
    t0 = time.perf_counter()
    st.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
    seconds = time.perf_counter() - t0
    feats = st.encode(ref_texts, batch_size=batch_size, convert_to_numpy=True) if ref_texts else None
    return {"batch_size": batch_size, "seconds": seconds, "features": feats}


def gpu_flop_fraction(texts: list[str], peak_tflops: float, batch_tokens: int) -> dict:
    """Real tokens/s of a random BERT-base (L=12, H=768) at 128 tokens vs the bf16 peak."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    folder = Path(tempfile.mkdtemp(prefix="bench-bert-base-"))
    try:
        AutoTokenizer.from_pretrained(resolve_model("minilm")).save_pretrained(folder)
        config = BertConfig()  # bert-base shape, random weights
        BertModel(config).save_pretrained(folder, safe_serialization=True)
        long_texts = [(t + " ") * 8 for t in texts]  # every text reaches 128 tokens
        run = run_headstore(str(folder), long_texts, batch_tokens, "cuda", None, "float16", 128)
    finally:
        shutil.rmtree(folder)
    L, H, S = config.num_hidden_layers, config.hidden_size, 128
    flops_per_token = 2 * L * 12 * H * H + 4 * L * S * H
    tokens_per_s = run["real_tokens"] / run["seconds"]
    return {"tokens_per_s": tokens_per_s, "flops_per_token": flops_per_token,
            "tflops": tokens_per_s * flops_per_token / 1e12,
            "fraction_of_peak": tokens_per_s * flops_per_token / (peak_tflops * 1e12)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--limit", type=int, default=None, help="subsample this many texts")
    parser.add_argument("--data", default=os.environ.get(
        "HEADSTORE_DATA", str(Path(__file__).resolve().parents[1].parent / "shared" / "datasets")))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-tokens", default=None, help="comma list to try")
    parser.add_argument("--st-batch-sizes", default=None, help="comma list to try")
    parser.add_argument("--ref-sample", type=int, default=64)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    gpu = args.device == "cuda"
    batch_tokens = [int(x) for x in (args.batch_tokens or
                                     ("32768,65536,131072" if gpu else "4096,8192,16384")).split(",")]
    st_sizes = [int(x) for x in (args.st_batch_sizes or ("64,128,256" if gpu else "16,32,64")).split(",")]
    texts = load_texts(Path(args.data), args.limit)
    ref_texts = random.Random(1).sample(texts, min(args.ref_sample, len(texts)))
    model_dir = resolve_model(args.model)
    max_length = model_identity(args.model).max_length
    ref = reference(model_dir, ref_texts, max_length)

    # interleaved and repeated (--repeats), best time kept: a shared machine's load drifts
    runs_hs, runs_st = {}, {}
    for _ in range(args.repeats):
        for b in batch_tokens:
            r = run_headstore(args.model, texts, b, args.device, ref_texts)
            runs_hs[b] = min(runs_hs.get(b, r), r, key=lambda x: x["seconds"])
        for b in st_sizes:
            r = run_st(model_dir, texts, b, args.device, ref_texts, max_length)
            runs_st[b] = min(runs_st.get(b, r), r, key=lambda x: x["seconds"])
    runs_hs, runs_st = list(runs_hs.values()), list(runs_st.values())
    real_tokens = runs_hs[0]["real_tokens"]
    rows = []
    for name, runs, key in (("headstore", runs_hs, "batch_tokens"), ("sentence-transformers", runs_st, "batch_size")):
        for r in runs:
            rows.append({"system": name, "batch": f"{key}={r[key]}", "seconds": round(r["seconds"], 2),
                         "texts_per_s": round(len(texts) / r["seconds"], 1),
                         "real_tokens_per_s": round(real_tokens / r["seconds"], 0),
                         "max_abs_diff_vs_ref": float(np.abs(r["features"] - ref).max())})
    best_hs = min(r["seconds"] for r in runs_hs)
    best_st = min(r["seconds"] for r in runs_st)
    result = {"device": args.device, "n_texts": len(texts), "real_tokens": real_tokens,
              "n_truncated": runs_hs[0]["n_truncated"], "torch_threads": torch.get_num_threads(),
              "runs": rows, "speedup_vs_sentence_transformers": round(best_st / best_hs, 3)}
    if gpu:
        result["bert_base_128"] = gpu_flop_fraction(texts, args.peak_tflops, max(batch_tokens))

    print(f"\n{len(texts)} texts, {real_tokens} real tokens, device {args.device}, "
          f"{torch.get_num_threads()} torch threads")
    print(f"{'system':<22} {'batch':<20} {'seconds':>8} {'texts/s':>9} {'real tok/s':>11} {'max|diff|':>10}")
    for r in rows:
        print(f"{r['system']:<22} {r['batch']:<20} {r['seconds']:>8} {r['texts_per_s']:>9} "
              f"{r['real_tokens_per_s']:>11.0f} {r['max_abs_diff_vs_ref']:>10.2e}")
    print(f"best headstore / best sentence-transformers speed: "
          f"{result['speedup_vs_sentence_transformers']}x")
    if gpu:
        b = result["bert_base_128"]
        print(f"BERT-base @128 tokens: {b['tokens_per_s']:,.0f} tok/s = {b['tflops']:.1f} TFLOP/s "
              f"= {100 * b['fraction_of_peak']:.1f}% of {args.peak_tflops} TFLOP/s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
