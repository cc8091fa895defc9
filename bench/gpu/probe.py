"""What the GPU box offers for packed (varlen) attention: versions, kernels, and a packed tiny-BERT forward
against the padded one (no headstore imports: runs before anything is installed there).

    python3 bench/gpu/probe.py
"""

from __future__ import annotations

import importlib
import inspect
import json
import platform
import subprocess
import sys
import time

import torch
import transformers


def section(name):
    print(f"\n== {name}", flush=True)


def try_(label, fn):
    try:
        out = fn()
        print(f"{label}: OK {out if out is not None else ''}", flush=True)
        return out
    except Exception as err:  # a probe: report every failure and go on
        print(f"{label}: FAIL {type(err).__name__}: {str(err)[:300]}", flush=True)
        return None


LENS = [5, 37, 128, 1, 64]  # the lengths of the packed test sequences (the padded batch: 5 x 128)


def print_versions():
    """Python, torch, transformers, CUDA and the card; the optional packages' versions; nvidia-smi's line."""
    section("versions")
    print(json.dumps({"python": platform.python_version(), "torch": torch.__version__,
                      "transformers": transformers.__version__, "cuda": torch.version.cuda,
                      "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))
    for mod in ["flash_attn", "sentence_transformers", "onnxruntime", "optimum", "polars", "zarr", "peft",
                "kernels", "xformers"]:
        try_(f"import {mod}", lambda m=mod: getattr(importlib.import_module(m), "__version__", "?"))
    try_("nvidia-smi", lambda: subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                               "--format=csv,noheader"], capture_output=True, text=True).stdout.strip())


def import_varlen():
    """torch.nn.attention.varlen and its varlen_attn's signature; the module, or None where it is missing."""
    section("torch varlen")
    v = try_("import torch.nn.attention.varlen", lambda: importlib.import_module("torch.nn.attention.varlen"))
    if v is not None:
        try_("varlen_attn signature", lambda: str(inspect.signature(v.varlen_attn)))
    return v


def compare_varlen_kernels(v, cu, dev):
    """Per dtype: varlen_attn (where v is there) and nested jagged SDPA on LENS packed, each against a
    per-sequence fp32 SDPA (max |diff|)."""
    H, D = 12, 64
    T = sum(LENS)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        q, k, val = (torch.randn(T, H, D, device=dev, dtype=dtype) for _ in range(3))
        ref = torch.cat([torch.nn.functional.scaled_dot_product_attention(
            q[a:b].transpose(0, 1).float(), k[a:b].transpose(0, 1).float(), val[a:b].transpose(0, 1).float()
        ).transpose(0, 1) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])
        if v is not None:
            try_(f"varlen_attn {dtype}", lambda: float((v.varlen_attn(q, k, val, cu, cu, max(LENS), max(LENS)).float()
                                                        - ref).abs().max()))
        def nested():
            nq, nk, nv = (torch.nested.nested_tensor_from_jagged(x, cu.long()).transpose(1, 2) for x in (q, k, val))
            out = torch.nn.functional.scaled_dot_product_attention(nq, nk, nv).transpose(1, 2).values()
            return float((out.float() - ref).abs().max())
        try_(f"nested jagged SDPA {dtype}", nested)


def compare_packed_bert(v, cu, dev):
    """A tiny random BERT run packed (LENS in one row, v.varlen_attn registered as an AttentionInterface) in
    fp32 and bf16, each against the same model run padded in fp32 (max |diff| over the real tokens)."""
    section("packed tiny BERT via AttentionInterface")
    from transformers import AttentionInterface, BertConfig, BertModel

    def varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        # query (1, H, T, D) -> (T, H, D)
        cu_q = kwargs["cu_seq_lens_q"]
        q, k, val = (x[0].transpose(0, 1) for x in (query, key, value))
        out = v.varlen_attn(q, k, val, cu_q, cu_q, kwargs["max_length_q"], kwargs["max_length_q"], scale=scaling)
        return out.unsqueeze(0), None  # (1, T, H, D)

    try_("register", lambda: AttentionInterface.register("probe_varlen", varlen_attention))
    cfg = BertConfig(hidden_size=384, num_hidden_layers=2, num_attention_heads=12, intermediate_size=1536,
                     vocab_size=1000, max_position_embeddings=512)
    model = BertModel(cfg).to(dev).eval()
    ids = [torch.randint(5, 1000, (n,)) for n in LENS]
    S = max(LENS)
    padded = torch.zeros(len(LENS), S, dtype=torch.long)
    mask = torch.zeros(len(LENS), S, dtype=torch.long)
    for i, x in enumerate(ids):
        padded[i, :len(x)] = x
        mask[i, :len(x)] = 1
    with torch.inference_mode():
        ref = model(input_ids=padded.to(dev), attention_mask=mask.to(dev)).last_hidden_state
        ref = torch.cat([ref[i, :n] for i, n in enumerate(LENS)])

        def packed(dtype):
            m = model.to(dtype)
            m.config._attn_implementation = "probe_varlen"
            try_("set_attn_implementation", lambda: m.set_attn_implementation("probe_varlen"))
            pos = torch.cat([torch.arange(n) for n in LENS]).unsqueeze(0).to(dev)
            out = m(input_ids=torch.cat(ids).unsqueeze(0).to(dev), position_ids=pos,
                    cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=S, max_length_k=S).last_hidden_state[0]
            m.to(torch.float32)
            m.set_attn_implementation("sdpa")
            return float((out.float() - ref).abs().max())
        try_("packed fp32 vs padded fp32", lambda: packed(torch.float32))
        try_("packed bf16 vs padded fp32", lambda: packed(torch.bfloat16))


def print_matmul_ceiling(dev):
    """bf16 8192^3 matmuls per second on the card (3 warm-up, 10 timed), and the CPU cores."""
    section("bf16 matmul ceiling")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    print(f"bf16 8192^3: {10 * 2 * 8192 ** 3 / (time.perf_counter() - t) / 1e12:.0f} TFLOP/s")
    print(f"cpu: {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores")


def main():
    print_versions()
    v = import_varlen()
    dev = "cuda"
    torch.manual_seed(0)  # the kernels' inputs, then the tiny BERT's weights and ids: the same every run
    cu = torch.tensor([0] + list(torch.tensor(LENS).cumsum(0)), dtype=torch.int32, device=dev)
    compare_varlen_kernels(v, cu, dev)
    compare_packed_bert(v, cu, dev)
    print_matmul_ceiling(dev)

if __name__ == "__main__":
    sys.exit(main())
