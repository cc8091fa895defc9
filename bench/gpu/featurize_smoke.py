"""Smoke check of the GPU featurize path: MiniLM over ~2,000 texts under (precision, packing) in
{fp32, bf16} x {off, on}; per setting the real tokens/s, padded/real tokens, the tokenizer's tokens/s, the
attention kernel that ran, and max |diff| of unit rows against the fp32 padded features.

    python bench/gpu/featurize_smoke.py [--device cuda] [--n 2000] [--model minilm] [--json out.json]

Texts: SciFact abstracts and STS-B sentences from /work/shared/datasets (or --data) when present (a real
mix of long and short texts), else synthetic sentences of 3-300 words. Uses only the package: the same
encode loop as `cli featurize` (run.encode_in_plan_order), no store. Each setting runs twice, timed the
second time (the first warms up kernels and allocators).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

SETTINGS = [("fp32", "off"), ("fp32", "on"), ("bf16", "off"), ("bf16", "on")]


def load_texts(data: Path, n: int) -> tuple[list[str], str]:
    """n unique texts: half SciFact abstracts (long), half STS-B sentences (short), else synthetic."""
    from headstore.featurize.run.source import all_chunks, open_sources

    paths = [data / "scifact", data / "stsb"]
    if all(p.exists() for p in paths):
        by_source = [list(dict.fromkeys(t for _, chunk in all_chunks(open_sources([p], None)) for t in chunk))
                     for p in paths]
        texts = list(dict.fromkeys(by_source[0][: n // 2] + by_source[1][: n - n // 2]))
        return texts, "scifact+stsb"
    rng = random.Random(0)
    words = "the a of model text store feature encode read write cat dog river tree house blue".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 300))) + f" {i}" for i in range(n)], "synthetic"


def run_setting(model: str, device: str, precision: str, packing: str, texts: list[str]) -> tuple[dict, np.ndarray]:
    import torch

    from headstore.data.text_id import text_ids
    from headstore.featurize.encoder.config import FeaturizeConfig
    from headstore.featurize.encoder.model import load_encoder
    from headstore.featurize.encoder.packed import prepare_encoder
    from headstore.featurize.encoder.resolved import resolve
    from headstore.featurize.run.windows import encode_in_plan_order

    settings = resolve(FeaturizeConfig(model=model, device=device, precision=precision, packing=packing,
                                       dtype="float32", batch_tokens=None))  # 65536 on cuda, 4096 on a CPU
    encoder = load_encoder(model, settings.device, settings.max_length)
    path = prepare_encoder(encoder, settings.numerics, settings.packing)
    ids = text_ids(texts)
    for attempt in range(2):  # the first pass warms up
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        feats = np.zeros((len(texts), encoder.model.config.hidden_size), dtype=np.float32)
        real = slots = 0
        tokenize_s = 0.0
        t0 = time.perf_counter()
        for idx, out, tok, batch in encode_in_plan_order(settings, encoder, ids, texts):
            feats[idx] = out["features"]
            real, slots, tokenize_s = real + batch.n_real_tokens, slots + batch.n_slots, tok.seconds
        seconds = time.perf_counter() - t0
    row = {"precision": precision, "packing": packing, **path.summary(), "n_texts": len(texts),
           "real_tokens": real, "padded_per_real": round(slots / real, 3), "seconds": round(seconds, 3),
           "real_tokens_per_s": round(real / seconds, 1),
           "encoder_tokens_per_s": round(real / max(seconds - tokenize_s, 1e-9), 1),
           "tokenize_tokens_per_s": round(real / max(tokenize_s, 1e-9), 1)}
    if device == "cuda":
        row["peak_memory_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return row, feats


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--data", type=Path, default=Path("/work/shared/datasets"))
    ap.add_argument("--settings", default=",".join(f"{p}:{k}" for p, k in SETTINGS),
                    help="precision:packing pairs, comma-separated; the first is the reference")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    import torch
    import transformers

    texts, source = load_texts(args.data, args.n)
    print(f"{len(texts)} texts ({source}), torch {torch.__version__}, transformers {transformers.__version__}, "
          f"device {torch.cuda.get_device_name() if args.device == 'cuda' else args.device}", flush=True)
    rows, reference = [], None
    for setting in args.settings.split(","):
        precision, packing = setting.split(":")
        row, feats = run_setting(args.model, args.device, precision, packing, texts)
        reference = unit(feats) if reference is None else reference
        row["max_abs_diff_vs_first"] = float(np.abs(unit(feats) - reference).max())
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"source": source, "device": args.device, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
