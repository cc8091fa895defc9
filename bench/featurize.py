"""Benchmark: headstore featurize vs sentence-transformers `encode`, same model, texts, pooling.

    python bench/featurize.py --limit 500 --json runs/bench-featurize.json

Texts: the SciFact corpus (title + " " + text) and the STS-B sentences (deduplicated), subsampled
with --limit. Every measured run is a fresh subprocess, so each system runs in the environment its
users give it: headstore as `cli featurize` runs it (importing `featurize` defaults
OMP_WAIT_POLICY=PASSIVE), sentence-transformers in this shell's environment ("omp=default") and,
like for like, with OMP_WAIT_POLICY=PASSIVE too ("omp=PASSIVE"). Each precision (--precisions) is
compared like for like: headstore bf16 against sentence-transformers under
torch.autocast(bfloat16). Runs are interleaved and repeated (--repeats) because a shared machine's
load drifts; the table keeps each setting's best time, and the ratios are given both as best/best
and as the median over rounds of (best headstore / best sentence-transformers in that round).
Reports texts/s, real (non-padding) tokens/s, padded/real tokens, and the max abs difference of
each run's features from a plain fp32 transformers mean-pooling reference on a sample of texts.

The machine's limit is measured in the same run (bench/limits.py: a large fp32 and bf16 matmul, probed
before and after, the best kept), and every row states its share of the limit of its precision: real
tokens/s x FLOPs per token of the model, counted from its config.json as
    2 * L * (4 H^2 + 2 H I)   (Q, K, V and output projections, the FFN's two matmuls; multiply-add = 2)
  + 4 * L * n * H            (QK^T and attention-times-V over the text's own n tokens, per token)
with L layers, hidden H, intermediate I (embeddings, LayerNorm, softmax and pooling left out): about
22 MFLOP per token for MiniLM at n ~ 128. The shares count the useful work only (padding is waste).

On GPU it also measures real tokens/s of a random-weight BERT-base-shaped model at 128 tokens as a
fraction of the bf16 peak (--peak-tflops, 989 for an H100 SXM; the matmul probe is printed beside it),
counting FLOPs per token as above with I = 4H at n = 128.
"""

from __future__ import annotations

import os

ENV_AT_START = dict(os.environ)  # before `featurize` is imported (it defaults OMP_WAIT_POLICY)
OMP_AT_START = os.environ.get("OMP_WAIT_POLICY", "default")

def _sentence_transformers_worker() -> bool:
    """This process is a --worker running sentence-transformers (not headstore)."""
    import json
    import sys

    if "--worker" not in sys.argv:
        return False
    with open(sys.argv[sys.argv.index("--worker") + 1]) as f:
        return json.load(f)["system"] != "headstore"


if OMP_AT_START == "default" and _sentence_transformers_worker():
    # sentence-transformers "as it comes": load torch (and its OpenMP runtime) before `import headstore`
    # (used for reading data) sets OMP_WAIT_POLICY=PASSIVE, so the runtime keeps its own default as in a
    # user's process; headstore's own workers keep what importing headstore does
    import torch  # noqa: F401

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from headstore.data.readers import read_beir, read_sts  # noqa: E402
from headstore.data.text_id import doc_text, text_ids  # noqa: E402


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
    import torch
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


def model_flops(model_dir: str, n_tokens: np.ndarray) -> float:
    """Useful forward FLOPs of encoding texts of n_tokens tokens each (see the module doc)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    L, H = int(config["num_hidden_layers"]), int(config["hidden_size"])
    inter = int(config.get("intermediate_size", 4 * H))
    n = np.asarray(n_tokens, dtype=np.float64)
    return float((n * (2 * L * (4 * H * H + 2 * H * inter)) + 4 * L * H * n * n).sum())


def st_padded_tokens(texts: list[str], n_tokens: np.ndarray, batch_size: int) -> int:
    """Padded tokens of sentence-transformers' plan: sorted by character length (longest first),
    cut every batch_size texts, each batch padded to its longest."""
    order = np.argsort([-len(t) for t in texts], kind="stable")
    return int(sum(len(idx) * n_tokens[idx].max()
                   for idx in (order[a:a + batch_size] for a in range(0, len(order), batch_size))))


# ---- one measured run, in its own process ----------------------------------------------------

def run_headstore(model: str, texts: list[str], batch_tokens: int, device: str, ref_texts,
                  dtype: str = "float32", max_length: int | None = None,
                  precision: str = "auto") -> dict:
    from headstore.featurize.config import FeaturizeConfig
    from headstore.featurize.run import featurize_texts
    from headstore.featurize.store import FeatureStore

    folder = Path(tempfile.mkdtemp(prefix="bench-store-"))
    try:
        config = FeaturizeConfig(model=model, dtype=dtype, batch_tokens=batch_tokens, device=device,
                                 max_length=max_length, precision=precision)
        summary = featurize_texts(config, texts, folder / "s")
        store = FeatureStore.open(folder / "s")
        feats = store.features()[store.rows_for(text_ids(ref_texts))] if ref_texts else None
    finally:
        shutil.rmtree(folder)
    return {"seconds": summary["encode_seconds"], "real_tokens": summary["real_tokens"],
            "padded_tokens": summary["padded_tokens"], "precision": summary["precision"],
            "features": feats, "n_truncated": summary["n_truncated"]}


def run_st(model_dir: str, texts: list[str], batch_size: int, device: str, ref_texts,
           max_length: int, precision: str) -> dict:
    import contextlib

    import torch
    from sentence_transformers import SentenceTransformer, models

    module = models.Transformer(model_dir, max_seq_length=max_length)
    dim = (getattr(module, "get_embedding_dimension", None) or module.get_word_embedding_dimension)()
    pooling = models.Pooling(dim, pooling_mode="mean")
    st = SentenceTransformer(modules=[module, pooling], device=device)  # no Normalize: same pooling
    autocast = (torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
                if precision == "bf16" else contextlib.nullcontext())
    with autocast:
        st.encode(texts[:8], batch_size=8)  # warm-up
        t0 = time.perf_counter()
        st.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
        seconds = time.perf_counter() - t0
        feats = st.encode(ref_texts, batch_size=batch_size, convert_to_numpy=True,
                          show_progress_bar=False) if ref_texts else None
    return {"seconds": seconds, "features": None if feats is None else feats.astype(np.float32)}


def worker(spec_path: str) -> None:
    """Child-process entry: run the spec, write its result (JSON) and features (.npy) beside it."""
    spec = json.loads(Path(spec_path).read_text())
    texts = json.loads(Path(spec["texts"]).read_text())
    ref_texts = json.loads(Path(spec["ref_texts"]).read_text())
    if spec["system"] == "headstore":
        r = run_headstore(spec["model"], texts, spec["batch"], spec["device"], ref_texts,
                          precision=spec["precision"])
    else:
        r = run_st(spec["model_dir"], texts, spec["batch"], spec["device"], ref_texts,
                   spec["max_length"], spec["precision"])
    import torch

    np.save(spec_path + ".npy", r.pop("features"))
    r["torch_threads"] = torch.get_num_threads()
    r["omp_wait_policy"] = OMP_AT_START if spec["system"] != "headstore" else os.environ.get("OMP_WAIT_POLICY")
    Path(spec_path + ".out.json").write_text(json.dumps(r))


def measure(spec: dict, env: dict, folder: Path) -> dict:
    path = folder / f"spec-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, __file__, "--worker", str(path)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench worker failed ({spec}):\n{proc.stderr[-3000:]}")
    result = json.loads(Path(str(path) + ".out.json").read_text())
    result["features"] = np.load(str(path) + ".npy")
    return result


def gpu_flop_fraction(texts: list[str], peak_tflops: float, batch_tokens: int) -> dict:
    """Real tokens/s of a random BERT-base (L=12, H=768) at 128 tokens vs the bf16 peak."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from headstore.featurize.model import resolve_model

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
    flops_per_token = 2 * L * (4 * H * H + 2 * H * config.intermediate_size) + 4 * L * S * H
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
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--batch-tokens", default=None, help="comma list to try")
    parser.add_argument("--st-batch-sizes", default=None, help="comma list to try")
    parser.add_argument("--precisions", default="fp32,bf16", help="comma list of fp32, bf16")
    parser.add_argument("--st-omp", default="default,PASSIVE",
                        help="OMP_WAIT_POLICY settings for sentence-transformers runs "
                             "(default = this shell's environment)")
    parser.add_argument("--ref-sample", type=int, default=64)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)

    import torch

    from headstore.featurize.model import model_identity, resolve_model

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device == "cuda"
    batch_tokens = [int(x) for x in (args.batch_tokens or
                                     ("32768,65536,131072" if gpu else "2048,4096")).split(",")]
    st_sizes = [int(x) for x in (args.st_batch_sizes or ("64,128,256" if gpu else "32,64")).split(",")]
    precisions = [p for p in args.precisions.split(",") if p]
    if any(p not in ("fp32", "bf16") for p in precisions):
        raise ValueError(f"--precisions takes fp32 and/or bf16, got {args.precisions!r}")
    st_omps = [o for o in args.st_omp.split(",") if o]
    texts = load_texts(Path(args.data), args.limit)
    ref_texts = random.Random(1).sample(texts, min(args.ref_sample, len(texts)))
    model_dir = resolve_model(args.model)
    max_length = model_identity(args.model).max_length
    ref = reference(model_dir, ref_texts, max_length)
    from transformers import AutoTokenizer

    from headstore.featurize.encode import tokenize

    n_tokens = tokenize(AutoTokenizer.from_pretrained(model_dir), texts, max_length).n_tokens
    total_flops = model_flops(model_dir, n_tokens)  # useful forward FLOPs of encoding every text once
    import limits

    probes = [limits.probe(precisions, device)]

    def st_env(omp: str) -> dict:
        env = dict(ENV_AT_START)
        if omp != "default":
            env["OMP_WAIT_POLICY"] = omp
        return env

    # settings: (system, precision, batch, omp); interleaved, each round runs every setting once
    settings = []
    for precision in precisions:
        settings += [("headstore", precision, b, "featurize") for b in batch_tokens]
        settings += [("sentence-transformers", precision, b, omp) for b in st_sizes for omp in st_omps]
    folder = Path(tempfile.mkdtemp(prefix="bench-featurize-"))
    (folder / "texts.json").write_text(json.dumps(texts))
    (folder / "ref.json").write_text(json.dumps(ref_texts))
    best, rounds = {}, []
    try:
        for _ in range(args.repeats):
            this_round = {}
            for key in settings:
                system, precision, batch, omp = key
                spec = {"system": "headstore" if system == "headstore" else "st", "model": args.model,
                        "model_dir": model_dir, "max_length": max_length, "device": device,
                        "batch": batch, "precision": precision, "texts": str(folder / "texts.json"),
                        "ref_texts": str(folder / "ref.json")}
                env = dict(ENV_AT_START) if system == "headstore" else st_env(omp)
                r = measure(spec, env, folder)
                this_round[key] = r["seconds"]
                best[key] = min(best.get(key, r), r, key=lambda x: x["seconds"])
                print(f"  {system} {precision} batch={batch} omp={r['omp_wait_policy']}: "
                      f"{r['seconds']:.2f}s", file=sys.stderr, flush=True)
            rounds.append(this_round)
    finally:
        shutil.rmtree(folder)

    probes.append(limits.probe(precisions, device))
    limit = limits.best_of(*probes)
    hs_any = next(v for k, v in best.items() if k[0] == "headstore")
    real_tokens = hs_any["real_tokens"]
    rows = []
    for key, r in best.items():
        system, precision, batch, omp = key
        hs = system == "headstore"
        padded = r["padded_tokens"] if hs else st_padded_tokens(texts, n_tokens, batch)
        rows.append({"system": system, "precision": precision,
                     "batch": f"{'batch_tokens' if hs else 'batch_size'}={batch}",
                     "omp_wait_policy": r["omp_wait_policy"], "seconds": round(r["seconds"], 2),
                     "texts_per_s": round(len(texts) / r["seconds"], 1),
                     "real_tokens_per_s": round(real_tokens / r["seconds"], 0),
                     "padded_per_real": round(padded / real_tokens, 3),
                     "gflop_per_s": round(total_flops / r["seconds"] / 1e9, 1),
                     "share_of_limit": round(total_flops / r["seconds"] / 1e9 / limit[precision], 3),
                     "max_abs_diff_vs_fp32_ref": float(np.abs(r["features"] - ref).max())})

    def ratio(precision: str, omp: str) -> dict:
        def fastest(times: dict, system: str) -> float:
            return min(t for (s, p, _, o), t in times.items()
                       if s == system and p == precision and (s == "headstore" or o == omp))
        b = fastest({k: v["seconds"] for k, v in best.items()}, "sentence-transformers") / \
            fastest({k: v["seconds"] for k, v in best.items()}, "headstore")
        per_round = [fastest(t, "sentence-transformers") / fastest(t, "headstore") for t in rounds]
        return {"best_over_best": round(b, 3), "median_per_round": round(statistics.median(per_round), 3)}

    speedups = {f"{p} vs sentence-transformers omp={o}": ratio(p, o) for p in precisions for o in st_omps}
    machine = limits.machine(device)
    rows = limits.with_machine(rows, machine)
    result = {"machine": machine, "device": device, "n_texts": len(texts), "real_tokens": real_tokens,
              "flops_per_token": total_flops / real_tokens, "matmul_probes": probes, "limit_gflop_per_s": limit,
              "n_truncated": hs_any["n_truncated"], "torch_threads": hs_any["torch_threads"],
              "load_average": os.getloadavg(), "runs": rows, "speedups": speedups}
    if gpu:
        result["bert_base_128"] = gpu_flop_fraction(texts, args.peak_tflops, max(batch_tokens))

    print(f"\n{len(texts)} texts, {real_tokens} real tokens, {total_flops / real_tokens / 1e6:.1f} MFLOP per token, "
          f"device {device}, {hs_any['torch_threads']} torch threads, load average {os.getloadavg()[0]:.1f}")
    print(limits.machine_line(machine))
    print("matmul limit (best of the probes before/after): " +
          ", ".join(f"{p} {v:,.0f} GFLOP/s" for p, v in limit.items()))
    print("\n| system | precision | setting | omp | real tokens/s | GFLOP/s | share of limit | padded/real | "
          "max abs diff vs fp32 reference |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['system']} | {r['precision']} | {r['batch']} | {r['omp_wait_policy']} | "
              f"{r['real_tokens_per_s']:,.0f} | {r['gflop_per_s']:,.0f} | {100 * r['share_of_limit']:.0f}% | "
              f"{r['padded_per_real']} | {r['max_abs_diff_vs_fp32_ref']:.1e} |")
    for name, s in speedups.items():
        print(f"headstore {name}: {s['best_over_best']}x best/best, "
              f"{s['median_per_round']}x median per round")
    if gpu:
        b = result["bert_base_128"]
        print(f"BERT-base @128 tokens: {b['tokens_per_s']:,.0f} tok/s = {b['tflops']:.1f} TFLOP/s "
              f"= {100 * b['fraction_of_peak']:.1f}% of {args.peak_tflops} TFLOP/s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
