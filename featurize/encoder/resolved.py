"""A featurize run's settings resolved once, at the door: `resolve(config, device)` -> `ResolvedSettings`.

A FeaturizeConfig holds the options as given, where `auto`, None and 0 mean "the default for where it runs".
`resolve` turns them, once, into plain values: the device (`auto`: cuda when available), the precision and the
numerics the encoder runs in, whether to ask for packed batches, the model's identity (hashes, max length), its
sentence embedding (pooling, Dense, Normalize) and prompts, the batch plan's settings and tokenizer threads, the
store's row width, and from these the store's fingerprint parts (`ResolvedSettings.parts`). It refuses what cannot
run (a layer the model lacks, fp16 on a CPU, a runtime backend off the CPU or in another precision) before
anything is read or created. Every room below (run/plan.py, run/windows.py, run/local.py, run/ray_engine.py,
encoder/packed.py, encoder/backends.py) reads these values and resolves none again.

One setting stays open: `--backend auto` weighs the loaded encoder's cached exports and the run's new text, so
it is chosen at the run's first new texts (backends.choose_backend), from the values resolved here.

`store_numerics` reads the numerics back from a store's fingerprint parts (heads.apply: new text encoded as the
store's rows were).
"""

from __future__ import annotations

from dataclasses import dataclass

from headstore.featurize.encoder.backends import backend_part, check_backend
from headstore.featurize.encoder.config import FINGERPRINTED_NUMERICS, FeaturizeConfig
from headstore.featurize.encoder.encode import CODE_VERSION
from headstore.featurize.encoder.model import ModelIdentity, check_options, pick_device
from headstore.featurize.encoder.sentence import SentenceSpec, resolve_prompts, resolve_spec, sentence_dim

GPU_BATCH_TOKENS = 65536  # batch_tokens None on cuda: a GPU wants far larger batches than a CPU's cache


@dataclass(frozen=True)
class ResolvedSettings:
    """Every setting of a featurize run, resolved for the device it runs on (plain values)."""

    identity: ModelIdentity  # --model resolved: its id, directory, weights and tokenizer hashes, max length
    spec: SentenceSpec  # the sentence embedding: pooling modes, Dense, Normalize
    prompts: dict  # {"query": ..., "document": ...}: the prompt each role's texts are encoded under ("" none)
    layers: tuple[int, ...]
    dim: int  # the store's row width
    dtype: str  # the store's float16 | float32
    device: str  # cpu | cuda
    precision: str  # fp32 | bf16 | fp16 (the fingerprint's precision part)
    numerics: str  # a key of config.NUMERICS: the weights' dtype and autocast
    packing: bool  # unpadded batches asked for (the encoder may still refuse: packed.prepare_encoder)
    backend: str  # auto | torch | onnx | openvino (auto is chosen at the first new texts)
    export_cache: str | None
    num_threads: int  # torch's CPU threads (0: every core)
    tokenize_threads: int
    batch_tokens: int
    max_batch_size: int
    batch_overhead_tokens: int
    window_texts: int
    commit_seconds: float
    chunk_rows: int
    shard_rows: int

    @property
    def max_length(self) -> int:
        return self.identity.max_length

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def parts(self) -> dict:
        """The store's fingerprint parts: what changes the stored numbers (store.layout.FINGERPRINT_PARTS and
        OPTIONAL_PARTS)."""
        identity = self.identity
        return {"model_id": identity.model_id, "weights_hash": identity.weights_hash,
                "tokenizer_hash": identity.tokenizer_hash, **self.spec.parts(),
                "layers": list(self.layers), "max_length": identity.max_length,
                "dtype": self.dtype, "precision": self.precision, "code_version": CODE_VERSION,
                **({"prompts": dict(self.prompts)} if any(self.prompts.values()) else {}),  # absent: before prompts
                **numerics_part(self.numerics), **backend_part(self.backend, self.precision)}


def resolve(config: FeaturizeConfig, device: str | None = None) -> ResolvedSettings:
    """`config` resolved on `device` (None: config.device, `auto` picking cuda where available); a one-line
    ValueError for options that cannot run, from the model's config.json alone (no weights loaded)."""
    device = device or pick_device(config.device)
    identity, hidden = check_options(config.model, config.max_length, config.layers)
    spec = resolve_spec(config.pooling, identity.model_dir)
    prompts = resolve_prompts(identity.model_dir, config.query_prompt, config.document_prompt, config.prompt_name)
    precision = resolved_precision(config.precision, device)
    numerics = resolved_numerics(config.precision, precision, device)
    dim = sentence_dim(spec, hidden, config.layers)
    check_backend(config.backend, device, precision, config.packing == "on")
    batch_tokens = config.batch_tokens
    if batch_tokens is None:  # the device's budget (config.FeaturizeConfig.batch_tokens says why)
        batch_tokens = GPU_BATCH_TOKENS if device == "cuda" else FeaturizeConfig.batch_tokens
    return ResolvedSettings(
        identity=identity, spec=spec, prompts=prompts, layers=tuple(config.layers),
        dim=dim, dtype=config.dtype, device=device, precision=precision, numerics=numerics,
        packing=config.packing == "on" or (config.packing == "auto" and device == "cuda"),
        backend=config.backend, export_cache=config.export_cache,
        num_threads=config.num_threads,
        tokenize_threads=config.tokenize_threads or (4 if device == "cuda" else 1),
        batch_tokens=batch_tokens, max_batch_size=config.max_batch_size,
        batch_overhead_tokens=batch_overhead(config.batch_overhead_tokens, batch_tokens, precision, device),
        window_texts=config.window_texts, commit_seconds=config.commit_seconds, chunk_rows=config.chunk_rows,
        shard_rows=config.shard_rows)


def resolved_precision(precision: str, device: str) -> str:
    """fp32 or bf16 (or fp16) on the resolved device ("cpu" or "cuda"). auto picks fp32 on every CPU, with
    native bf16 (AMX, AVX-512-BF16) or without, and bf16 on CUDA. Not bf16 on a CPU with native bf16:
    docs/speed.md's runs on an AMX Xeon gave bf16 only 1.0-1.7x fp32's tokens/s under +-30% noise,
    at ~1e-2 instead of 1e-6 feature error, and precision is part of a store's fingerprint: a store
    begun with auto must take more texts with auto on any other CPU. On a CPU without native bf16 an
    explicit bf16 is emulated (5-300x slower) and warns (featurize.encoder.hardware)."""
    if precision in ("bf16-autocast", "bf16-weights"):
        return "bf16"
    if precision != "auto":
        return precision
    return "bf16" if device == "cuda" else "fp32"


def resolved_numerics(given: str, precision: str, device: str) -> str:
    """A key of NUMERICS for --precision `given`, resolved to `precision` on `device`. On cuda bf16 (and auto) hold
    the weights in bf16: no per-matmul re-cast of fp32 weights, half the weight traffic; bf16-autocast keeps the
    old path. On CPU bf16 stays autocast (the numerics CPU bf16 stores were made with); bf16-weights holds them in
    bf16 on any device (a CPU with native bf16: no per-matmul cast, half the weight traffic); fp16 has no CPU path
    worth having and is refused there."""
    if given == "bf16-weights":
        return "bf16-weights"
    if precision == "fp32":
        return "fp32"
    if precision == "fp16" and device != "cuda":
        raise ValueError("precision fp16 needs --device cuda (on a CPU it is emulated); use fp32 or bf16")
    if given == "bf16-autocast" or device != "cuda":
        return "bf16-autocast"
    return f"{precision}-weights"


def batch_overhead(given: int | None, batch_tokens: int, precision: str, device: str) -> int:
    """batch_overhead_tokens, or its default for the device and precision (config.FeaturizeConfig says why)."""
    if given is not None:
        return given
    if device == "cuda":
        return batch_tokens
    return 512 if precision == "bf16" else 128


def numerics_part(numerics: str) -> dict:
    """{"numerics": ...} for weights held in bf16/fp16, else {} (fp32 and bf16-autocast stores predate the
    part and keep their fingerprint). Packing is not a part: in fp32 it moves features by ~1e-7, as a
    different batch plan does (also not a part); in bf16 a packed and a padded batch differ by bf16's rounding
    in different kernels, as two batch plans' shapes already do, far inside the bf16-vs-fp32 bound (1e-2),
    while bf16-weights and bf16-autocast round different tensors (weights vs each matmul's inputs)."""
    return {"numerics": numerics} if numerics in FINGERPRINTED_NUMERICS else {}


def store_numerics(parts: dict) -> str:
    """The config.NUMERICS key a store's encoder ran in, from its fingerprint parts: its `numerics` part (weights
    held in bf16/fp16), else by its precision (fp32, or bf16 autocast over fp32 weights: the stores made before
    the part; fp16 came with it, as fp16 weights)."""
    if "numerics" in parts:
        return parts["numerics"]
    return {"fp32": "fp32", "bf16": "bf16-autocast", "fp16": "fp16-weights"}[parts.get("precision", "fp32")]
