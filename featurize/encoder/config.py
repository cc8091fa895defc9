"""The settings of one featurize run as given, as a small frozen dataclass of plain values (`auto`, None and 0
mean "the default for where it runs": featurize.encoder.resolved resolves them, once, at the run's door).

The parts that change the stored numbers (model, pooling, layers, max length, dtype, precision) go
into the store's fingerprint; the rest (batch size, device, commit period; the
backend in fp32, which each segment records) only change speed.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from headstore.data.errors import SettingError
from headstore.featurize.encoder.backends import AUTO, CHOICES

DTYPES = ("float16", "float32")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16", "fp16", "bf16-autocast", "bf16-weights")
PACKINGS = ("auto", "on", "off")
# how the encoder's maths runs: (dtype its weights are held in, autocast dtype or None). The precision
# part of the fingerprint says fp32|bf16|fp16; the optional `numerics` part names the weights-held modes,
# which stores made before them never had (their bf16 was autocast over fp32 weights).
NUMERICS = {"fp32": ("float32", None), "bf16-autocast": ("float32", "bfloat16"),
            "bf16-weights": ("bfloat16", None), "fp16-weights": ("float16", None)}
FINGERPRINTED_NUMERICS = ("bf16-weights", "fp16-weights")
POOLING_NAMES = ("cls", "max", "mean", "model")  # model: the model's own modules (sentence.py); the rest override


@dataclass(frozen=True)
class FeaturizeConfig:
    # `minilm` (the offline all-MiniLM-L6-v2), a local HF model dir, or a Hub id.
    model: str = "minilm"
    # model: the sentence embedding the model's authors configured (modules.json: Pooling, Dense, Normalize),
    # mask-aware mean pooling for a plain checkpoint; mean|cls|max override it (featurize.encoder.sentence).
    pooling: str = "model"
    # prompts prepended to the texts of each role (None: the model's own prompts, sentence.resolve_prompts);
    # a text under another prompt is another row. prompt_name: one of the model's named prompts, for both roles.
    query_prompt: str | None = None
    document_prompt: str | None = None
    prompt_name: str | None = None
    # hidden-state layers to store; -1 (the last) is what every head uses by default.
    layers: tuple[int, ...] = (-1,)
    # None: the model's own (sentence_bert_config max_seq_length, else tokenizer max up to 512).
    max_length: int | None = None
    # float16 halves the store and the heads' memory; its ~1e-3 relative error is far below
    # what heads can resolve. float32 for exact comparisons.
    dtype: str = "float16"
    # padded tokens per forward batch on CPU: 2-4k keeps a batch's activations in cache (MiniLM
    # on 2 cores: 2048-4096 ran 6-15% faster than 8192 with the same plan, fp32 and bf16).
    # GPUs want far more: None is 4096 on CPU and 65536 on cuda (resolved.GPU_BATCH_TOKENS; the cli's default).
    batch_tokens: int | None = 4096
    # modelled cost of one forward call, in padded tokens, for the batch plan (encode.plan_batches):
    # it trades padding against the number of calls. None: on CPU 128 for fp32 and 512 for bf16
    # (measured on MiniLM: a call costs about 100 fp32 tokens of work, and bf16 work is ~3x
    # cheaper), so texts of one exact length get unpadded batches; on GPU batch_tokens (calls are
    # dear: batches fill the budget unless that wastes more than a batch of padding).
    batch_overhead_tokens: int | None = None
    # compute precision of the encoder. auto: fp32 on every CPU (the reference maths), bf16 autocast
    # on GPU (tensor cores). bf16 on CPU uses AMX/AVX512-BF16 where present (1.0-1.7x fp32's tokens/s
    # on MiniLM on the README's AMX Xeon, within its +-30% noise) at ~1e-2 absolute error; where the
    # CPU lacks them it is emulated and 5-300x slower, and an explicit bf16 warns (featurize.encoder.hardware).
    # Pooling is fp32 either way; precision is part of the fingerprint. bf16-weights: the weights held in bf16 on any
    # device (on CPU too: no per-matmul cast), in the fingerprint's numerics part (resolved.resolved_numerics).
    precision: str = "auto"
    # unpadded batches: a batch's real tokens as one sequence, attention kept within each text (varlen;
    # featurize.encoder.packed). auto: on for cuda where the architecture supports it (no padding computed, one
    # varlen kernel per layer), off on CPU: there the length-sorted plan pads only 1-3% and the per-text
    # attention loop cost more than that (MiniLM fp32, 80 texts: 62-82 vs 162-192 real tokens/s; docs/speed.md).
    packing: str = "auto"
    # tokenizer threads over chunks of a window (the Rust tokenizer releases the GIL); 0: 4 on cuda, where the
    # host must keep up with the card, 1 on CPU, where the cores are the encoder's.
    tokenize_threads: int = 0
    # upper bound on texts per batch, so a corpus of very short texts does not form huge batches.
    max_batch_size: int = 1024
    # auto: cuda when available, else cpu.
    device: str = "auto"
    # commit (one new texts part + the manifest) at most this often, or every shard_rows rows:
    # bounds the work lost to a crash and the number of parts. 0 = after every batch.
    commit_seconds: float = 30.0
    # rows per zarr chunk and per shard file: 256-row chunks read fast for row subsets; 64k-row
    # shards keep the file count low (one file per 64k texts).
    chunk_rows: int = 256
    shard_rows: int = 65536
    # CPU threads for torch; 0 = all cores.
    num_threads: int = 0
    # where the encoder forward runs (backends.py): torch, or on a CPU the exported graph in ONNX Runtime or
    # OpenVINO (the `cpu-fast` extra). auto: the fastest one installed and proven exact for the model (its export's
    # parity check: within 1e-5 of torch), chosen once per run: OpenVINO in fp32 on a CPU (1.25x torch on MiniLM,
    # 2-core Zen 4), torch on a GPU, in bf16 and where no runtime is installed. In fp32 the backend is provenance
    # (each segment records it), not a fingerprint part: a store takes more texts from any of them.
    backend: str = "auto"
    # folder of the cached exports of --backend onnx|openvino (exported.py); None: ~/.cache/headstore/exports
    # ($XDG_CACHE_HOME), beside the other per-machine results, not inside a store (one export serves every store).
    export_cache: str | None = None
    # input texts read, deduplicated, tokenised and planned at a time: bounds memory (~1 KB per
    # text of a window) whatever the corpus size, while 256k texts still sort well by length. Window
    # boundaries depend on the input alone; a rerun must use the same value to resume bit-exactly.
    window_texts: int = 262144

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} not valid; choose one of {list(DTYPES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r} not valid; choose one of {list(PRECISIONS)}")
        if self.packing not in PACKINGS:
            raise ValueError(f"packing {self.packing!r} not valid; choose one of {list(PACKINGS)}")
        if self.backend not in CHOICES:
            raise ValueError(f"backend {self.backend!r} not valid; choose one of {list(CHOICES)}")
        if self.precision == "bf16-weights" and self.backend not in ("torch", AUTO):
            raise ValueError(f"precision bf16-weights holds torch's weights in bf16; give --backend torch (--backend "
                             f"{self.backend} takes --precision bf16 or fp32)")
        if self.tokenize_threads < 0:
            raise SettingError("tokenize_threads", f"must be >= 0, got {self.tokenize_threads}")
        if self.batch_overhead_tokens is not None and self.batch_overhead_tokens < 0:
            raise ValueError(f"batch_overhead_tokens must be >= 0, got {self.batch_overhead_tokens}")
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r} not valid; choose one of {list(DEVICES)}")
        if self.pooling not in POOLING_NAMES:
            raise ValueError(f"pooling {self.pooling!r} not valid; choose one of {sorted(POOLING_NAMES)}")
        if not self.layers or len(set(self.layers)) != len(self.layers):
            raise ValueError(f"layers must be a non-empty list of distinct ints, got {self.layers}")
        if self.max_length is not None and self.max_length < 2:
            raise SettingError("max_length", f"must be >= 2 (room for [CLS] and [SEP]), got {self.max_length}")
        for name in ("batch_tokens", "max_batch_size", "window_texts"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise SettingError(name, f"must be >= 1, got {getattr(self, name)}")
        if self.shard_rows % self.chunk_rows:
            raise ValueError(f"shard_rows ({self.shard_rows}) must be a multiple of chunk_rows ({self.chunk_rows})")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)


def parse_layers(text: str) -> tuple[int, ...]:
    """'-1,-4' -> (-1, -4); a clear ValueError for anything else."""
    try:
        layers = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"layers must be comma-separated ints such as -1,-4; got {text!r}") from None
    if not layers:
        raise ValueError(f"layers must name at least one layer; got {text!r}")
    return layers


# The settings of `cli adapt` (featurize/tuning/adapt.py): continued MLM pre-training of the encoder.
@dataclass(frozen=True)
class AdaptConfig:
    model: str = "minilm"  # name for featurize.encoder.model.resolve_model, or a model directory
    max_length: int = 128  # block length; MiniLM was trained at 128-256, and short blocks are cheap
    mlm_probability: float = 0.15  # BERT's masking rate
    whole_word: bool = False  # BERT's original per-piece masking; True masks whole words (every piece [MASK])
    train_encoder: bool = True  # False trains only the head: the honest baseline for a fresh head
    lr: float = 5e-5  # the usual continued-pre-training rate; higher forgets faster
    fresh_head_lr: float = 1e-3  # a newly initialised head's own parameters (not the tied decoder)
    # learn fast: at `lr` it needs thousands of steps, feeding noise to the encoder all along
    warmup_ratio: float = 0.06  # RoBERTa-style short warm-up for AdamW's moment estimates
    weight_decay: float = 0.01  # BERT's; not applied to biases and LayerNorm
    max_grad_norm: float = 1.0  # clipping guards the fresh head's first large gradients
    batch_size: int = 32  # blocks per step; 32 x 128 tokens fits a CPU step in about a second
    epochs: float = 1.0  # passes over the blocks, used when max_steps is None
    max_steps: int | None = None  # fixed step budget (overrides epochs); the cap under until_settled
    # True: stop at the first check (every `settle_check` steps) where the loss has settled (featurize.tuning.
    # settle), else at the cap; the lr stays constant after its warm-up (a run of unknown length has no end to
    # decay to, and a decaying rate would flatten the loss by itself). False: the whole budget, linear decay
    until_settled: bool = False
    settle_check: int = 100  # steps between checks: the first judges ten ten-step means (quarters of 20 steps)
    holdout_fraction: float = 0.0  # texts kept out of training for evaluation (by text_id hash)
    seed: int = 0  # data order, masks, dropout and a fresh head
    device: str = "auto"  # "auto" = cuda when available
    bf16: bool = True  # bf16 autocast on CUDA and on a CPU with native bf16 (ignored where emulated: slow)
    save_every: int = 200  # steps between checkpoints

    def __post_init__(self):
        for name, holds, what in (("max_steps", self.max_steps is None or self.max_steps >= 1, ">= 1"),
                                  ("batch_size", self.batch_size >= 1, ">= 1"), ("save_every", self.save_every >= 1, ">= 1"),
                                  ("epochs", self.epochs > 0, "> 0"),
                                  ("settle_check", self.settle_check >= 40, ">= 40 (four ten-step means: the "
                                   "least the settled rule judges)")):
            if not holds:
                raise SettingError(name, f"must be {what}, got {getattr(self, name)}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise SettingError("device", f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")
