"""CPU backends, one run: headstore's encode loop with --backend torch|onnx|openvino|auto against
sentence-transformers' `SentenceTransformer(model_dir, backend=...)` at several batch sizes, MiniLM fp32,
on texts with a real length mix (SciFact corpus + STS-B, evenly spaced over the length order), real tokens/s.

    python3 bench/speed/cpu_backends.py --texts 1000 --rounds 3 --out /tmp/cpu_backends.json \
        [--st-python /path/to/venv/bin/python]

Each system lives in a worker process that loads its model once, then encodes the whole text set when told
to; the orchestrator runs the systems in turn, round after round (A, B, C, A, B, C, ...), so load from other
processes falls on all of them alike, and reports each system's median, best and every round. A worker's
first encode of a set is a warm-up (export, kernel choice), not timed. headstore's figure is
`run.encode_in_plan_order` (tokenise, plan, forward, pool: all but the store writes); sentence-transformers'
is `encode` (tokenise, forward, pool). Both get the features' max |diff| (unit rows) against headstore torch.

sentence-transformers' onnx/openvino backends need optimum, which pins transformers below the 5.x headstore
uses (optimum-intel 2.2: transformers<5.6, huggingface-hub<1.22; optimum-onnx 0.1: transformers<4.58, so its
onnx backend cannot install beside sentence-transformers 6.2 at all). `--st-python` names a Python (a venv
with `optimum-intel[openvino]==2.2.0 "transformers<5.6" "huggingface-hub<1.22"` over the system site)
that runs the sentence-transformers worker; default: this Python (its torch backend only, where optimum is absent).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

DATA = ("scifact", "stsb")
MAX_LENGTH = 256


def text_set(data_root: Path, k: int) -> list[str]:
    """k unique texts of SciFact (corpus and queries) and STS-B, evenly spaced over their length order."""
    from headstore.featurize.run.source import all_chunks, open_sources

    texts = list(dict.fromkeys(t for _, chunk in all_chunks(open_sources([data_root / d for d in DATA], None))
                               for t in chunk))
    by_length = sorted(range(len(texts)), key=lambda i: (len(texts[i]), texts[i]))
    picked = np.unique(np.linspace(0, len(texts) - 1, min(k, len(texts))).round().astype(np.int64))
    return [texts[by_length[i]] for i in picked]


def unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


# ---- workers: each reads {"system": ...} lines on stdin, answers one JSON line per request -------------

def headstore_worker(texts: list[str], cache: str) -> None:
    from headstore.featurize.encoder.config import FeaturizeConfig
    from headstore.featurize.encoder.model import encoding_settings
    from headstore.featurize.encoder.backends import AUTO_MIN_CHARS
    from headstore.featurize.encoder.resolved import resolve
    from headstore.featurize.run.windows import encode_in_plan_order, open_encoder

    loaded = {}

    def encode(backend: str, batch_tokens: int, texts: list[str]) -> np.ndarray:
        settings = resolve(FeaturizeConfig(model="minilm", max_length=MAX_LENGTH, dtype="float32", backend=backend,
                                           export_cache=cache, batch_tokens=batch_tokens, device="cpu"))
        if backend not in loaded:  # auto chooses as for a run that repays an export (the main job's 36k texts do)
            loaded[backend], choice = open_encoder(settings, AUTO_MIN_CHARS)
            print(f"headstore --backend {backend}: {choice.backend} ({choice.why})", file=sys.stderr, flush=True)
        ids = [f"{i:032x}" for i in range(len(texts))]
        out = np.zeros((len(texts), 384), dtype=np.float32)
        for idx, feats, _, _ in encode_in_plan_order(settings, loaded[backend], ids, texts):
            out[idx] = feats["features"]
        return out

    with encoding_settings("cpu", 0):
        serve(lambda r, part: encode(r["backend"], r.get("batch_tokens", 4096), part), texts)


def st_worker(texts: list[str], model_dir: str) -> None:
    from sentence_transformers import SentenceTransformer

    loaded = {}

    def encode(backend: str, batch_size: int, texts: list[str]) -> np.ndarray:
        if backend not in loaded:
            kwargs = {"model_kwargs": {"ov_config": {"INFERENCE_PRECISION_HINT": "f32"}}} if backend == "openvino" else {}
            loaded[backend] = SentenceTransformer(model_dir, device="cpu", backend=backend, **kwargs)
        return loaded[backend].encode(texts, batch_size=batch_size, convert_to_numpy=True)

    serve(lambda r, part: encode(r["backend"], r["batch_size"], part), texts)


def serve(encode, texts: list[str]) -> None:
    """Answer requests: the first for a setting warms up (untimed) on every 8th text (export, model load, kernels
    for most shapes), then times the whole set; features saved per request."""
    warmed = set()
    for line in sys.stdin:
        request = json.loads(line)
        key = json.dumps({k: v for k, v in request.items() if k != "save"}, sort_keys=True)
        if key not in warmed:
            encode(request, texts[::8])
            warmed.add(key)
        t0, c0 = time.perf_counter(), time.process_time()
        features = encode(request, texts)
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        np.save(request["save"], features)
        print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds}), flush=True)


# ---- orchestrator -----------------------------------------------------------------------------------------

SYSTEMS = {  # name -> (worker, request)
    "headstore torch fp32": ("headstore", {"backend": "torch"}),
    "headstore onnx fp32": ("headstore", {"backend": "onnx"}),
    "headstore openvino fp32": ("headstore", {"backend": "openvino"}),
    "headstore auto fp32": ("headstore", {"backend": "auto"}),  # the default: what featurize runs unless told
    "headstore openvino fp32, 2048 tokens": ("headstore", {"backend": "openvino", "batch_tokens": 2048}),
    "headstore openvino fp32, 1024 tokens": ("headstore", {"backend": "openvino", "batch_tokens": 1024}),
    **{f"sentence-transformers {b} fp32, batch {bs}": ("st", {"backend": b, "batch_size": bs})
       for b in ("torch", "openvino") for bs in (16, 32, 64, 128)},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-root", type=Path, default=Path("/work/shared/datasets"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--st-python", default=sys.executable)
    parser.add_argument("--systems", default="", help="|-separated names of SYSTEMS to run (default: all)")
    parser.add_argument("--worker", choices=("headstore", "st"), help=argparse.SUPPRESS)
    parser.add_argument("--cache", default="/tmp/headstore-bench-exports", help="the export cache (headstore)")
    args = parser.parse_args()
    from headstore.featurize.encoder.model import resolve_model

    model_dir = resolve_model("minilm")
    texts = text_set(args.data_root, args.texts)
    if args.worker == "headstore":
        return headstore_worker(texts, args.cache)
    if args.worker == "st":
        return st_worker(texts, model_dir)
    run(args, model_dir, texts)


def run(args, model_dir: str, texts: list[str]) -> None:
    from headstore.featurize.encoder.encode import tokenize
    from headstore.featurize.encoder.hardware import cpu_info
    from transformers import AutoTokenizer

    load_at_start = list(__import__("os").getloadavg())
    real_tokens = int(tokenize(AutoTokenizer.from_pretrained(model_dir), texts, MAX_LENGTH).n_tokens.sum())
    keep = [s.strip() for s in args.systems.split("|") if s.strip()]
    systems = {n: s for n, s in SYSTEMS.items() if not keep or any(k == n for k in keep)}
    base = [sys.executable, __file__, "--texts", str(args.texts), "--data-root", str(args.data_root),
            "--out", str(args.out), "--cache", args.cache]
    workers = {"headstore": subprocess.Popen([*base, "--worker", "headstore"], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True)}
    if any(w == "st" for w, _ in systems.values()):
        workers["st"] = subprocess.Popen([args.st_python, *base[1:], "--worker", "st"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True)
    folder = args.out.with_suffix(".features")
    folder.mkdir(parents=True, exist_ok=True)
    seconds = {name: [] for name in systems}
    cpu_seconds = {name: [] for name in systems}  # every thread of the worker: the work, less other processes' load
    for r in range(args.rounds):
        for i, (name, (worker, request)) in enumerate(systems.items()):
            proc = workers[worker]
            proc.stdin.write(json.dumps({**request, "save": str(folder / f"{i}.npy")}) + "\n")
            proc.stdin.flush()
            answer = proc.stdout.readline()
            if not answer:
                raise SystemExit(f"worker {worker} ended at {name} (see its stderr)")
            seconds[name].append(json.loads(answer)["seconds"])
            cpu_seconds[name].append(json.loads(answer)["cpu_seconds"])
            print(f"round {r}: {name}: {real_tokens / seconds[name][-1]:,.0f} tokens/s, "
                  f"{real_tokens / cpu_seconds[name][-1]:,.0f} tokens per CPU second", flush=True)
    for proc in workers.values():
        proc.stdin.close()
        proc.wait(timeout=60)
    reference = unit_rows(np.load(folder / f"{list(systems).index('headstore torch fp32')}.npy")) \
        if "headstore torch fp32" in systems else None
    results = {}
    for i, name in enumerate(systems):
        feats = unit_rows(np.load(folder / f"{i}.npy"))
        results[name] = {"tokens_per_s_median": round(real_tokens / statistics.median(seconds[name]), 1),
                         "tokens_per_s_best": round(real_tokens / min(seconds[name]), 1),
                         "seconds": [round(s, 3) for s in seconds[name]],
                         "tokens_per_cpu_s_best": round(real_tokens / min(cpu_seconds[name]), 1),
                         "cpu_seconds": [round(s, 3) for s in cpu_seconds[name]],
                         "max_abs_diff_vs_headstore_torch": None if reference is None
                         else float(np.abs(feats - reference).max())}
    report = {"cpu": cpu_info(), "n_texts": len(texts), "real_tokens": real_tokens, "max_length": MAX_LENGTH,
              "rounds": args.rounds, "load_average_at_start": load_at_start, "load_average_at_end": list(__import__("os").getloadavg()), "results": results}
    args.out.write_text(json.dumps(report, indent=2))
    for name, r in results.items():
        print(f"{name:48s} median {r['tokens_per_s_median']:>9,.0f}  best {r['tokens_per_s_best']:>9,.0f} tokens/s"
              f"  best {r['tokens_per_cpu_s_best']:>9,.0f} per CPU s  max|diff| {r['max_abs_diff_vs_headstore_torch']}")


if __name__ == "__main__":
    main()
