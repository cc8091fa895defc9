"""Where the encoder forward runs on a CPU: torch, ONNX Runtime or OpenVINO; `auto` (the default) the fastest
one installed and proven exact for the model.

Only the forward changes: `use_backend` swaps `encoder.model` for a runtime model whose call takes what a
transformers model takes (input_ids, attention_mask, output_hidden_states) and returns its hidden states,
so tokenisation, the batch plan and pooling.pooled_forward (Pooling, Dense, prompts) stay one code path.
The graph is exported once per model and cached (featurize.encoder.exported) with its parity check (`parity`): the
runtime's hidden states against torch's on a fixed probe batch (PROBE_TEXTS, padded, one text cut at the
model's max length), every real token of every exported layer, in fp32. Within EXACT (1e-5) the runtime is
proven exact for that export's key (architecture, weights, layers, library versions); an explicit runtime
that fails it is refused, auto skips it. A proven runtime in fp32 is provenance, not a fingerprint part: each
committed segment records its backend (the manifest part's `backend`), so a store made with OpenVINO takes
more texts from torch and the reverse, as a packed and a padded batch already mix. In bf16 a runtime rounds
other tensors than torch's autocast, so there `backend` stays a fingerprint part (backend_part; absent for
torch, so torch stores keep their fingerprints; fp32 stores made when it was a part are accepted as they are:
store.check_fingerprint).

auto (`choose_backend`), once per run, at its first new texts: on a CPU, in fp32, with padded batches, the first
runtime of AUTO_ORDER that is installed, exports (an architecture the exporter cannot trace is skipped) and
passes its parity check; else torch (always on a GPU, in bf16 or fp16, with --packing on). An export not yet
cached is built only where the run's new texts are long enough to repay it (AUTO_MIN_CHARS).

BACKENDS is the single source of truth for the runtimes' names (config and CLI take CHOICES: auto, then
sorted(BACKENDS)); this module imports no runtime (nor torch) until a backend is used.
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
    precisions: tuple[str, ...]  # resolved precisions it runs (resolved.ResolvedSettings.precision)


BACKENDS = {
    "torch": Backend("torch", (), ("fp32", "bf16", "fp16")),
    # ONNX Runtime's CPU provider: fp32 only (it has no bf16 matmuls on CPU)
    "onnx": Backend("onnx", ("onnx", "onnxruntime"), ("fp32",)),
    # OpenVINO: fp32, or bf16 through its INFERENCE_PRECISION_HINT (native on AMX / AVX-512-BF16 CPUs)
    "openvino": Backend("openvino", ("openvino",), ("fp32", "bf16")),  # converted from torch, no ONNX
}
EXTRA = "cpu-fast"
AUTO = "auto"
CHOICES = (AUTO, *sorted(BACKENDS))
# auto's runtimes, fastest first: MiniLM fp32 on a 2-core AMD EPYC Zen 4, OpenVINO 7,696 real tokens/s against
# torch's 6,142 (1.25x, idle); under load OpenVINO 1,004, ONNX Runtime 601, torch 428 (docs/speed.md)
AUTO_ORDER = ("openvino", "onnx")
# the parity check's bound on |runtime - torch| over the probe's hidden states (fp32): a pooled feature (a mean,
# a token, a max of them) moves by at most as much, a normalised one by less (MiniLM: 2.5e-6 on states up to 6)
EXACT = 1e-5
# characters of new text (~4-5 a token in English) from which auto builds a missing export. MiniLM's OpenVINO
# export took 15.5 s on the 2-core Zen 4 under load: repaid after ~12k tokens at that load's speeds (1,004 vs 428
# tokens/s), after at most ~470k idle (7,696 vs 6,142, were it as slow). 1M characters (~230k tokens) sits between;
# a smaller run (every test's) keeps torch until an export is cached
AUTO_MIN_CHARS = 1_000_000
# the parity check's texts, padded as one batch with a fourth, their repeats cut at the model's max length
PROBE_TEXTS = ("a", "Feature stores keep each sentence embedding once.",
               ("Many small heads train on the stored features in minutes, beside the frozen baseline, and the best "
                "one is exported as a stock sentence-transformers model."))


@dataclass(frozen=True)
class Choice:
    """The backend a run uses and why (the summary's `backend` and `backend_choice`)."""
    backend: str
    why: str


def backend_part(backend: str, precision: str = "fp32") -> dict:
    """The store's optional fingerprint part: {"backend": name} for a runtime out of fp32 (its bf16 rounds other
    tensors than torch's); {} for torch, auto (torch out of fp32) and a runtime in fp32 (proven exact: provenance)."""
    return {} if backend in ("torch", AUTO) or precision == "fp32" else {"backend": backend}


def installed(backend: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in BACKENDS[backend].modules)


def check_backend(backend: str, device: str, precision: str, packing: bool = False) -> None:
    """One-line ValueError where `backend` cannot run this way (before anything is read or created); auto
    always can (it falls back to torch)."""
    if backend not in CHOICES:
        raise ValueError(f"backend {backend!r} not valid; choose one of {list(CHOICES)}")
    if backend in ("torch", AUTO):
        return
    spec = BACKENDS[backend]
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


def runner(backend: str, folder, threads: int, precision: str = "fp32"):
    """The runtime's call of (B, S) int64 ids and mask -> the exported layers' (B, S, D) float32 states."""
    return onnx_runner(folder, threads) if backend == "onnx" else openvino_runner(folder, threads, precision)


def parity(encoder, backend: str, folder, layers: tuple[int, ...], threads: int) -> dict:
    """The export's parity check: max |runtime - torch| (fp32) over the real tokens of PROBE_TEXTS, every layer."""
    import numpy as np
    import torch

    from headstore.featurize.encoder.exported import states_module

    longest = " ".join(PROBE_TEXTS[1:]) * 64  # cut at the model's max length: every position a run can use
    batch = encoder.tokenizer([*PROBE_TEXTS, longest], padding=True, truncation=True, max_length=encoder.max_length,
                              return_tensors="pt")
    ids, mask = batch["input_ids"].to(torch.int64), batch["attention_mask"].to(torch.int64)  # (B, S)
    with torch.inference_mode():
        reference = [s.float().numpy() for s in states_module(encoder.model, layers)(ids, mask)]
    states = runner(backend, folder, threads)(ids.numpy(), mask.numpy())
    real = mask.numpy().astype(bool)
    diff = max(float(np.abs(got[real] - ref[real]).max()) for got, ref in zip(states, reference))
    return {"max_abs_diff": diff, "tolerance": EXACT, "exact": diff <= EXACT, "probe_tokens": int(real.sum())}


def proven_export(encoder, backend: str, layers: tuple[int, ...], threads: int, cache_dir=None) -> tuple:
    """(the export's folder, its parity check): built and checked where absent, both cached (exported.py)."""
    from headstore.featurize.encoder.exported import cached_export, record_parity, recorded_parity

    folder = cached_export(encoder, backend, tuple(layers), cache_dir)  # ValueError naming an untraceable architecture
    checked = recorded_parity(folder)
    if checked is None or checked.get("tolerance") != EXACT:
        checked = parity(encoder, backend, folder, tuple(layers), threads)
        record_parity(folder, checked)
    return folder, checked


def auto_candidates(device: str, precision: str, packing: bool) -> tuple[tuple[str, ...], str]:
    """(the runtimes auto may pick here, fastest first; why torch where there are none)."""
    if device != "cpu":
        return (), f"torch on {device} (the runtimes run on a CPU)"
    if precision != "fp32":
        return (), f"torch in {precision} (a runtime is proven exact in fp32 only; give --backend openvino for its bf16)"
    if packing:
        return (), "torch with packed batches (the runtimes take padded ones)"
    found = tuple(b for b in AUTO_ORDER if installed(b))
    return found, "" if found else f"torch (no runtime installed: pip install 'headstore[{EXTRA}]')"


def choose_backend(encoder, layers: tuple[int, ...], precision: str, packing: bool = False, num_threads: int = 0,
                   cache_dir=None, n_chars: int | None = None) -> Choice:
    """auto's choice for this encoder: the first candidate proven exact whose export is cached, or worth building
    for `n_chars` characters of new text (None: only a cached one); else torch. Every runtime passed over is said."""
    from headstore.featurize.encoder.exported import is_cached

    candidates, why = auto_candidates(encoder.device, precision, packing)
    passed = []
    for name in candidates:
        if (n_chars or 0) < AUTO_MIN_CHARS and not is_cached(encoder, name, tuple(layers), cache_dir):
            passed.append(f"{name} not exported yet, and {n_chars or 0:,} characters of new text would not repay "
                          f"its export (from {AUTO_MIN_CHARS:,})")
            continue
        try:
            _, checked = proven_export(encoder, name, layers, cpu_threads(num_threads), cache_dir)
        except ValueError as err:  # an architecture the exporter cannot trace
            passed.append(f"{name}: {str(err).split('; use --backend')[0]}")
            continue
        if checked["exact"]:
            return Choice(name, f"auto: {name}, {checked['max_abs_diff']:.1e} from torch on this model's parity probe "
                                f"(within {EXACT:g}, fp32)" + "".join(f"; {p}" for p in passed))
        passed.append(f"{name}: {checked['max_abs_diff']:.1e} from torch on the parity probe, over {EXACT:g}")
    return Choice("torch", "auto: " + ("; ".join(["torch", *passed]) if passed else why))


def use_backend(encoder, backend: str, layers: tuple[int, ...], precision: str = "fp32",
                num_threads: int = 0, cache_dir=None):
    """`encoder` with its forward in `backend` (the same object for torch; else a copy whose model is a
    RuntimeModel giving `layers`); auto as choose_backend picks with cached exports only. The export comes from
    the cache (built and checked on first use); a runtime that fails its parity check is refused. The torch encoder
    must be prepared first (packed.prepare_encoder: its numerics read the torch forward; the copy keeps `encoder.path`)."""
    if backend == AUTO:
        backend = choose_backend(encoder, layers, precision, bool(encoder.path and encoder.path.packing), num_threads,
                                 cache_dir).backend
    if backend == "torch":
        return encoder
    assert encoder.path is not None, "prepare_encoder before use_backend: a RuntimeModel has no torch forward"
    threads = cpu_threads(num_threads)
    folder, checked = proven_export(encoder, backend, tuple(layers), threads, cache_dir)
    if not checked["exact"]:
        model_type = getattr(encoder.model.config, "model_type", None) or "this model"
        raise ValueError(f"--backend {backend}: its export of {model_type} is {checked['max_abs_diff']:.1e} from torch "
                         f"on the parity probe (over {EXACT:g}: not exact); use --backend torch or auto")
    run = runner(backend, folder, threads, precision)
    return dataclasses.replace(encoder, model=RuntimeModel(run, encoder.model.config, layers, backend))
