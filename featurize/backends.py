"""Where the encoder forward runs on a CPU: torch (the default), ONNX Runtime or OpenVINO.

Only the forward changes: `use_backend` swaps `encoder.model` for a runtime model whose call takes what a
transformers model takes (input_ids, attention_mask, output_hidden_states) and returns its hidden states,
so tokenisation, the batch plan and pooling.pooled_forward (Pooling, Dense, prompts) stay one code path.
The graph is exported once per model and cached (featurize.exported). A store records its backend (an
optional fingerprint part, absent for torch, so torch stores keep their fingerprints): runtimes fuse and
order the maths differently, within 1e-5 of torch in fp32 but not bit for bit.

BACKENDS is the single source of truth for the names (config and CLI take sorted(BACKENDS)); this module
imports no runtime (nor torch) until a backend is used.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    name: str
    modules: tuple[str, ...]  # Python modules it needs (all installed by the `cpu-fast` extra)
    precisions: tuple[str, ...]  # resolved precisions it runs (config.resolved_precision)


BACKENDS = {
    "torch": Backend("torch", (), ("fp32", "bf16", "fp16")),
    # ONNX Runtime's CPU provider: fp32 only (it has no bf16 matmuls on CPU)
    "onnx": Backend("onnx", ("onnx", "onnxruntime"), ("fp32",)),
    # OpenVINO: fp32, or bf16 through its INFERENCE_PRECISION_HINT (native on AMX / AVX-512-BF16 CPUs)
    "openvino": Backend("openvino", ("openvino",), ("fp32", "bf16")),  # converted from torch, no ONNX
}
EXTRA = "cpu-fast"


def backend_part(backend: str) -> dict:
    """The store's optional fingerprint part: {"backend": name} for a runtime, {} for torch."""
    return {} if backend == "torch" else {"backend": backend}


def check_backend(backend: str, device: str, precision: str, packing: bool = False) -> None:
    """One-line ValueError where `backend` cannot run this way (before anything is read or created)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} not valid; choose one of {sorted(BACKENDS)}")
    spec = BACKENDS[backend]
    if backend == "torch":
        return
    if device != "cpu":
        raise ValueError(f"--backend {backend} runs on the CPU; give --device cpu (or --backend torch on {device})")
    if precision not in spec.precisions:
        raise ValueError(f"--backend {backend} runs precision {' or '.join(spec.precisions)}, not {precision}; "
                         "give --precision fp32" + (" or --backend openvino" if precision == "bf16" else ""))
    if packing:
        raise ValueError(f"--backend {backend} takes padded batches; give --packing off (or auto)")
    missing = [m for m in spec.modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"--backend {backend} needs {', '.join(missing)}: pip install 'headstore[{EXTRA}]'")


class RuntimeOutputs:
    """What pooled_forward reads of a transformers model's output: last_hidden_state, or hidden_states[layer]
    for the layers the runtime model was exported with (a dict keyed by those layers)."""

    def __init__(self, layers: tuple[int, ...], states: list):
        self.hidden_states = dict(zip(layers, states))
        self.last_hidden_state = self.hidden_states.get(-1)


class RuntimeModel:
    """An exported encoder called like a transformers model: (B, S) int64 input_ids and attention_mask
    (None: no padding) -> RuntimeOutputs of float32 (B, S, D) torch tensors. `config`: the HF config."""

    def __init__(self, run, config, layers: tuple[int, ...], backend: str):
        self.run, self.config, self.layers, self.backend = run, config, tuple(layers), backend

    def __call__(self, input_ids, attention_mask=None, output_hidden_states=False, return_dict=True):
        import numpy as np
        import torch

        ids = input_ids.cpu().numpy().astype(np.int64, copy=False)  # (B, S)
        mask = np.ones_like(ids) if attention_mask is None else attention_mask.cpu().numpy().astype(np.int64)
        return RuntimeOutputs(self.layers, [torch.from_numpy(s) for s in self.run(ids, mask)])


def cpu_threads(num_threads: int) -> int:
    """num_threads, else the cores this process may run on."""
    if num_threads:
        return num_threads
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def onnx_runner(folder, threads: int):
    """ONNX Runtime's CPU session of model.onnx: all graph optimisations, `threads` intra-op threads, one
    inter-op thread (one batch at a time uses every core)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only: its shape-inference notes are not the user's concern
    session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])

    def run(ids, mask):
        return session.run(None, {"input_ids": ids, "attention_mask": mask})
    return run


def openvino_runner(folder, threads: int, precision: str):
    """OpenVINO's CPU plugin on the IR: the LATENCY hint (one stream using every core: featurize sends one
    batch at a time, each thousands of tokens), INFERENCE_PRECISION_HINT f32 (exact) or bf16, dynamic
    shapes (each planned batch has its own (B, S); the plugin caches its kernels per shape)."""
    import numpy as np
    import openvino as ov

    core = ov.Core()
    settings = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
                "INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32"}
    compiled = core.compile_model(core.read_model(str(folder / "model.xml")), "CPU", settings)
    request = compiled.create_infer_request()
    outputs = compiled.outputs

    def run(ids, mask):
        result = request.infer({"input_ids": ids, "attention_mask": mask})
        return [np.array(result[out], dtype=np.float32) for out in outputs]  # a copy: the request reuses its buffers
    return run


def use_backend(encoder, backend: str, layers: tuple[int, ...], precision: str = "fp32",
                num_threads: int = 0, cache_dir=None):
    """`encoder` with its forward in `backend` (the same object for torch; else a copy whose model is a
    RuntimeModel giving `layers`). The export comes from the cache (built on first use). The torch encoder must be
    prepared first (packed.prepare_encoder: its numerics read the torch forward; the copy keeps `encoder.path`)."""
    if backend == "torch":
        return encoder
    assert encoder.path is not None, "prepare_encoder before use_backend: a RuntimeModel has no torch forward"
    from headstore.featurize.exported import cached_export

    folder = cached_export(encoder, backend, tuple(layers), cache_dir)  # ValueError naming an untraceable architecture
    threads = cpu_threads(num_threads)
    run = onnx_runner(folder, threads) if backend == "onnx" else openvino_runner(folder, threads, precision)
    return dataclasses.replace(encoder, model=RuntimeModel(run, encoder.model.config, layers, backend))
