"""One bench/speed/featurize.py worker: one system and one model shape, in a fresh process.

    python bench/speed/featurize_worker.py SPEC.json

The spec lists the settings to run (each with its text set); every setting gets a warm-up on a slice of
its texts, then its timed runs, best kept. sentence-transformers settings that differ only in batch size
share one loaded model: each batch size runs once, then the fastest is run again (--repeats in all).
After each setting the results so far are written (SPEC.json.out.json, SPEC.json.<i>.npy: the features
of the reference sample), so a worker stopped by its time box keeps what it finished.

Peak memory: torch.cuda.max_memory_allocated on a GPU (reset before each run); on a CPU the process's
peak RSS during the run (sampled every 20 ms from /proc/self/statm; the process's own baseline included).
"""

from __future__ import annotations

import os
import sys

OMP_AT_START = os.environ.get("OMP_WAIT_POLICY", "default")
if "--st-first" in sys.argv:
    # sentence-transformers as it comes: torch (and its OpenMP runtime) loads before `import headstore`
    # sets OMP_WAIT_POLICY=PASSIVE, so the runtime keeps its own default as in a user's process
    import torch  # noqa: F401
else:
    # every other worker runs as `cli featurize` does: the CLI's process settings (OMP_WAIT_POLICY=PASSIVE, ...)
    # are made when headstore.cli is imported, before torch loads (the library itself sets nothing)
    import headstore.cli  # noqa: F401

import dataclasses  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

GPU_BATCH_TOKENS = 65536  # cli featurize's default on a GPU (unless featurize.encoder.config names its own)


class PeakMemory:
    """Peak device memory (cuda) or peak RSS (cpu) in bytes over a `with` block."""

    def __init__(self, device: str):
        self.device, self.peak, self._stop = device, 0, threading.Event()

    def __enter__(self):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        page = os.sysconf("SC_PAGE_SIZE")
        while True:
            with open("/proc/self/statm") as f:
                self.peak = max(self.peak, int(f.read().split()[1]) * page)
            if self._stop.wait(0.02):
                return

    def __exit__(self, *exc):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak = int(torch.cuda.max_memory_allocated())
        else:
            self._stop.set()
            self._thread.join()


def headstore_config(setting: dict, model_dir: str, device: str, max_length: int):
    """The FeaturizeConfig of a setting, or a string saying why this checkout cannot run it."""
    from headstore.featurize.encoder import config as config_module

    fields = {f.name for f in dataclasses.fields(config_module.FeaturizeConfig)}
    missing = [k for k in ("packing", "backend") if k in setting and k not in fields]
    if missing:
        return f"FeaturizeConfig has no field {', '.join(missing)} (not in this checkout)"
    batch = setting.get("batch") or (getattr(config_module, "GPU_BATCH_TOKENS", GPU_BATCH_TOKENS)
                                     if device == "cuda" else config_module.FeaturizeConfig.batch_tokens)
    kwargs = dict(model=model_dir, dtype="float32", device=device, max_length=max_length,
                  precision=setting["precision"], batch_tokens=batch,
                  **{k: setting[k] for k in ("packing", "backend") if k in setting})
    try:
        return config_module.FeaturizeConfig(**kwargs)
    except ValueError as err:
        return str(err)


def run_headstore(config, texts: list[str], sample: list[str] | None, device: str) -> tuple[dict, np.ndarray | None]:
    from headstore.data.text_id import text_ids
    from headstore.featurize.run.local import featurize_texts
    from headstore.featurize.store.reader import FeatureStore

    folder = Path(tempfile.mkdtemp(prefix="bench-store-"))
    try:
        t0 = time.perf_counter()
        with PeakMemory(device) as mem:
            summary = featurize_texts(config, texts, folder / "s")
        wall = time.perf_counter() - t0
        store = FeatureStore.open(folder / "s")
        feats = store.features()[store.rows_for(text_ids(sample))] if sample else None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    keep = ("real_tokens", "padded_tokens", "numerics", "packing_reason", "attention_kernel", "tokenize_seconds",
            "tokenize_tokens_per_s", "encoder_seconds", "encoder_tokens_per_s", "n_batches", "n_truncated")
    used = {"precision": "precision_used", "packing": "packing_used", "backend": "backend_used"}  # as run
    run = {"seconds": summary["encode_seconds"], "wall_seconds": round(wall, 3), "peak_memory_bytes": mem.peak,
           "batch_tokens": config.batch_tokens,
           "encode_tokens_per_s": summary.get("encode_tokens_per_s", summary.get("tokens_per_s")),
           **{k: summary[k] for k in keep if k in summary}, **{v: summary[k] for k, v in used.items() if k in summary}}
    return run, feats


def load_st(model_dir: str, device: str, setting: dict, max_length: int):
    """A SentenceTransformer in the setting's precision/attention/backend, or a string saying why not."""
    import torch
    from sentence_transformers import SentenceTransformer

    attn, backend = setting.get("attn"), setting.get("backend", "torch")
    if attn == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        return "the flash-attn package is not installed"
    try:
        model_kwargs = {"attn_implementation": attn} if attn and backend == "torch" else {}
        if backend == "openvino":  # its default is bf16 where the CPU has it: the precision is said explicitly
            model_kwargs["ov_config"] = {"INFERENCE_PRECISION_HINT": {"fp32": "f32"}.get(setting["precision"], "bf16")}
        st = SentenceTransformer(model_dir, device=device, backend=backend, model_kwargs=model_kwargs)
    except Exception as err:  # an absent optional runtime (optimum, onnxruntime, openvino) or kernel
        return f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
    st.max_seq_length = max_length
    if backend == "torch" and setting["precision"] in ("fp16", "bf16"):
        st = st.to({"fp16": torch.float16, "bf16": torch.bfloat16}[setting["precision"]])
    return st


def run_st(st, texts: list[str], sample_idx: np.ndarray, batch: int, device: str) -> tuple[dict, np.ndarray]:
    t0 = time.perf_counter()
    with PeakMemory(device) as mem:
        emb = st.encode(texts, batch_size=batch, convert_to_tensor=True, show_progress_bar=False)
    seconds = time.perf_counter() - t0
    import torch

    feats = emb[torch.as_tensor(sample_idx, device=emb.device)].float().cpu().numpy()
    return {"seconds": round(seconds, 3), "wall_seconds": round(seconds, 3), "peak_memory_bytes": mem.peak}, feats


class Worker:
    def __init__(self, spec_path: str):
        self.path = spec_path
        self.spec = json.loads(Path(spec_path).read_text())
        self.results: list[dict] = []
        self.sets = {}
        for name, ts in self.spec["text_sets"].items():
            texts = json.loads(Path(ts["texts"]).read_text())
            idx = np.asarray(ts["sample"], dtype=np.int64)
            self.sets[name] = {"texts": texts, "sample_idx": idx, "sample": [texts[i] for i in idx],
                               "max_length": ts["max_length"], "warmup": texts[:: max(1, len(texts) // ts["warmup"])]}

    def late(self) -> bool:
        return time.time() > self.spec["deadline"]

    def record(self, i: int, setting: dict, status: str, runs: list[dict] | None = None, feats=None,
               reason: str | None = None) -> None:
        row = {"index": i, **setting, "status": status, "reason": reason}
        if runs:
            best = min(runs, key=lambda r: r["seconds"])
            row.update(best, all_seconds=[r["seconds"] for r in runs],
                       peak_memory_bytes=max(r["peak_memory_bytes"] for r in runs))
        if feats is not None:
            np.save(f"{self.path}.{i}.npy", np.asarray(feats, dtype=np.float32))
        self.results.append(row)
        Path(self.path + ".out.json").write_text(json.dumps(self.results))

    def run(self) -> None:
        if self.spec["system"] == "headstore":
            for i, setting in enumerate(self.spec["settings"]):
                self.headstore_setting(i, setting)
        else:
            groups: dict[tuple, list[int]] = {}
            for i, s in enumerate(self.spec["settings"]):
                key = tuple(sorted((k, str(v)) for k, v in s.items() if k != "batch"))
                groups.setdefault(key, []).append(i)
            for indices in groups.values():
                self.st_group(indices)

    def headstore_setting(self, i: int, setting: dict) -> None:
        ts, device = self.sets[setting["text_set"]], self.spec["device"]
        if self.late():
            return self.record(i, setting, "skipped", reason="time budget")
        config = headstore_config(setting, self.spec["model_dir"], device, ts["max_length"])
        if isinstance(config, str):
            return self.record(i, setting, "unavailable", reason=config)
        run_headstore(config, ts["warmup"], None, device)  # warm-up: kernels, caches, allocator
        runs, feats = [], None
        for _ in range(self.spec["repeats"]):
            run, feats = run_headstore(config, ts["texts"], ts["sample"], device)
            runs.append(run)
            if self.late():
                break
        self.record(i, setting, "ok", runs, feats)

    def st_group(self, indices: list[int]) -> None:
        """Settings that differ only in batch size: one model; each batch size once, the fastest again."""
        settings = [self.spec["settings"][i] for i in indices]
        ts, device = self.sets[settings[0]["text_set"]], self.spec["device"]
        if self.late():
            return [self.record(i, s, "skipped", reason="time budget") for i, s in zip(indices, settings)]
        st = load_st(self.spec["model_dir"], device, settings[0], ts["max_length"])
        if isinstance(st, str):
            return [self.record(i, s, "unavailable", reason=st) for i, s in zip(indices, settings)]
        done: dict[int, tuple[list, np.ndarray]] = {}
        for i, s in zip(indices, settings):
            if self.late():
                break
            run_st(st, ts["warmup"][: 4 * s["batch"]], ts["sample_idx"][:0], s["batch"], device)  # warm-up
            run, feats = run_st(st, ts["texts"], ts["sample_idx"], s["batch"], device)
            done[i] = ([run], feats)
        if done:
            fastest = min(done, key=lambda i: done[i][0][0]["seconds"])
            batch = self.spec["settings"][fastest]["batch"]
            for _ in range(self.spec["repeats"] - 1):
                if self.late():
                    break
                done[fastest][0].append(run_st(st, ts["texts"], ts["sample_idx"], batch, device)[0])
        for i, s in zip(indices, settings):
            if i in done:
                self.record(i, s, "ok", done[i][0], done[i][1])
            else:
                self.record(i, s, "skipped", reason="time budget")


def main(spec_path: str) -> None:
    worker = Worker(spec_path)
    worker.run()
    import torch

    meta = {"torch_threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default")
            if worker.spec["system"] == "headstore" else OMP_AT_START}
    Path(spec_path + ".meta.json").write_text(json.dumps(meta))


if __name__ == "__main__":
    main(sys.argv[1])
