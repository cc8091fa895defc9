"""A model's own sentence embedding: the Pooling, Dense and Normalize modules a sentence-transformers model
directory lists in `modules.json`, read without torch, as the `SentenceSpec` a store records.

`--pooling model` (the default) applies them as the model's authors configured them; a plain Hugging Face
checkpoint (no modules.json) keeps mask-aware mean pooling of the last layer; `--pooling mean|cls|max`
overrides. The spec's fingerprint parts (`SentenceSpec.parts`) are exactly the old `{"pooling": "mean"}` for
plain mean pooling, so stores made before this module stay valid; every other choice adds keys
(`include_prompt`, `dense`, `normalize`), so a store made with other modules is refused.

A final, parameter-free Normalize is not applied to the stored vectors: it is recorded (manifest `normalize`,
and per array) and applied on read (`FeatureStore.features`), so a store of MiniLM's mean-pooled features made
before this module becomes its `--pooling model` store by `cli store migrate` without encoding again. Dense
layers (trained parameters) are applied when encoding, to the last layer only (where they were trained).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

# sentence-transformers' Pooling modes (the order of its legacy pooling_mode_* keys, which is the order in which
# several modes are concatenated)
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
LEGACY_MODE_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                    "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                    "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
# Dense activations by the class path sentence-transformers saves; nothing else is imported from a config
ACTIVATIONS = {"torch.nn.modules.linear.Identity": "identity", "torch.nn.modules.activation.Tanh": "tanh",
               "torch.nn.modules.activation.ReLU": "relu", "torch.nn.modules.activation.GELU": "gelu",
               "torch.nn.modules.activation.Sigmoid": "sigmoid", "torch.nn.modules.activation.SiLU": "silu"}
MODULE_KINDS = {"Transformer": "transformer", "Pooling": "pooling", "Dense": "dense", "Normalize": "normalize"}
OVERRIDES = ("cls", "max", "mean")  # --pooling values that ignore the model's modules


@dataclass(frozen=True)
class DenseSpec:
    path: str  # folder inside the model directory (e.g. 2_Dense)
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a key of ACTIVATIONS' values: identity, tanh, ...
    residual: bool  # sentence-transformers' use_residual
    sha256: str  # of its model.safetensors: part of the fingerprint


@dataclass(frozen=True)
class SentenceSpec:
    modes: tuple[str, ...] = ("mean",)  # Pooling modes, concatenated in this order
    include_prompt: bool = True  # False: prompt tokens are left out of the pooling (INSTRUCTOR-style models)
    dense: tuple[DenseSpec, ...] = ()  # applied in order after pooling, to the last layer only
    normalize: bool = False  # a final Normalize: recorded, applied on read

    def parts(self) -> dict:
        """The store fingerprint parts: {"pooling": "mean"} alone for plain mean pooling (stores made before
        model pooling existed), more keys for anything else."""
        out: dict = {"pooling": "+".join(self.modes)}
        if not self.include_prompt:
            out["include_prompt"] = False
        if self.dense:
            out["dense"] = [asdict(d) for d in self.dense]
        if self.normalize:
            out["normalize"] = True
        return out

    @classmethod
    def from_parts(cls, parts: dict) -> "SentenceSpec":
        modes = tuple(str(parts["pooling"]).split("+"))
        for mode in modes:
            if mode not in POOLING_MODES:
                raise ValueError(f"pooling mode {mode!r} recorded in a store manifest is unknown; "
                                 f"known: {list(POOLING_MODES)}")
        return cls(modes, bool(parts.get("include_prompt", True)),
                   tuple(DenseSpec(**d) for d in parts.get("dense", ())), bool(parts.get("normalize", False)))

    def out_dim(self, hidden_size: int) -> int:
        """Width of a stored row of the last layer."""
        return self.dense[-1].out_features if self.dense else len(self.modes) * hidden_size

    def describe(self) -> str:
        words = [f"{'+'.join(self.modes)} pooling" + ("" if self.include_prompt else " (prompt left out)")]
        words += [f"Dense {d.in_features}->{d.out_features} {d.activation}" for d in self.dense]
        return ", ".join(words + (["Normalize (on read)"] if self.normalize else []))


def resolve_spec(pooling: str, model_dir: str | Path) -> SentenceSpec:
    """The sentence embedding `--pooling` asks for: the model's own modules (`model`), or an override."""
    if pooling in OVERRIDES:
        return SentenceSpec((pooling,))
    if pooling != "model":
        raise ValueError(f"pooling {pooling!r} not valid; choose one of {sorted((*OVERRIDES, 'model'))}")
    return read_model_spec(Path(model_dir)) or SentenceSpec()


def _json(path: Path) -> dict | list:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read the sentence-transformers configuration ({err})") from None


def read_model_spec(model_dir: Path) -> SentenceSpec | None:
    """The SentenceSpec of a sentence-transformers model directory; None without modules.json."""
    listing = model_dir / "modules.json"
    if not listing.is_file():
        return None
    modules = sorted(_json(listing), key=lambda m: int(m.get("idx", 0)))
    kinds = []
    for m in modules:
        kind = MODULE_KINDS.get(str(m.get("type", "")).rsplit(".", 1)[-1])
        if kind is None:
            raise ValueError(f"{listing}: module {m.get('type')!r} is not one headstore can apply (it applies "
                             f"{', '.join(MODULE_KINDS)}); give --pooling mean|cls|max to pool the encoder yourself")
        kinds.append((kind, model_dir / m.get("path", "")))
    if [k for k, _ in kinds[:1]] != ["transformer"] or sum(k == "transformer" for k, _ in kinds) != 1:
        raise ValueError(f"{listing}: expected one Transformer module first; found {[k for k, _ in kinds]}")
    rest = [k for k, _ in kinds[1:]]
    if rest.count("pooling") != 1 or rest[0] != "pooling" or "normalize" in rest[:-1]:
        raise ValueError(f"{listing}: headstore applies Transformer, Pooling, Dense..., Normalize (last) in that "
                         f"order; this model lists {[k for k, _ in kinds]} (give --pooling mean|cls|max)")
    modes, include_prompt = _pooling(kinds[1][1] / "config.json")
    dense = tuple(_dense(path) for kind, path in kinds if kind == "dense")
    return SentenceSpec(modes, include_prompt, dense, rest[-1] == "normalize")


def _pooling(config_file: Path) -> tuple[tuple[str, ...], bool]:
    config = _json(config_file)
    mode = config.get("pooling_mode")
    if mode is None:  # the legacy boolean keys, in their fixed order
        mode = [m for key, m in LEGACY_MODE_KEYS.items() if config.get(key)] or ["mean"]
    modes = (mode,) if isinstance(mode, str) else tuple(mode)
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown:
        raise ValueError(f"{config_file}: pooling mode {unknown[0]!r} unknown; known: {list(POOLING_MODES)}")
    return modes, bool(config.get("include_prompt", True))


def _dense(folder: Path) -> DenseSpec:
    config = _json(folder / "config.json")
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise ValueError(f"{folder}: Dense weights must be model.safetensors (only safetensors are loaded)")
    activation = config.get("activation_function", "torch.nn.modules.activation.Tanh")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{folder / 'config.json'}: activation {activation!r} is not one headstore applies "
                         f"({', '.join(sorted(ACTIVATIONS))})")
    if config.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        raise ValueError(f"{folder / 'config.json'}: a Dense on {config['module_input_name']!r} (not the sentence "
                         "embedding) is not supported")
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    return DenseSpec(folder.name, int(config["in_features"]), int(config["out_features"]),
                     bool(config.get("bias", True)), ACTIVATIONS[activation], bool(config.get("use_residual", False)),
                     digest)


def sentence_dim(spec: SentenceSpec, hidden_size: int, layers) -> int:
    """The width of the store's rows; ValueError when its arrays would differ in width (a Dense changes the
    last layer's width, and a store holds one width)."""
    last = spec.out_dim(hidden_size)
    other = len(spec.modes) * hidden_size
    if any(layer != -1 for layer in layers) and last != other:
        raise ValueError(f"this model's Dense makes last-layer rows {last} wide and other layers' {other}: one "
                         "store holds one width; featurize the extra layers into another store with --pooling mean")
    return last if -1 in layers else other


# the names a model's config_sentence_transformers.json gives each role's prompt, most usual first
ROLE_PROMPT_NAMES = {"query": ("query",), "document": ("document", "passage", "corpus", "doc")}


def model_prompts(model_dir: str | Path) -> tuple[dict[str, str], str | None]:
    """(prompts, default_prompt_name) of a sentence-transformers model directory ({} , None without)."""
    file = Path(model_dir) / "config_sentence_transformers.json"
    if not file.is_file():
        return {}, None
    config = _json(file)
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise ValueError(f"{file}: `prompts` must map names to prompt strings")
    return prompts, config.get("default_prompt_name")


def resolve_prompts(model_dir: str | Path, query_prompt: str | None = None, document_prompt: str | None = None,
                    prompt_name: str | None = None) -> dict[str, str]:
    """The prompt of each role: an explicit --query-prompt / --document-prompt, or --prompt-name (one of the
    model's own prompts, for both roles: given with an explicit prompt it is refused, as neither would say
    which wins); else the model's prompt named after the role (query; document, passage, corpus), else its
    default_prompt_name's prompt, else none."""
    explicit = [f"--{role}-prompt" for role, given in (("query", query_prompt), ("document", document_prompt))
                if given is not None]
    if prompt_name is not None and explicit:
        raise ValueError(f"--prompt-name {prompt_name!r} and {' and '.join(explicit)} both set a prompt: --prompt-name "
                         f"sets both roles' prompts; give either it or {' / '.join(explicit)}")
    prompts, default_name = model_prompts(model_dir)
    if prompt_name is not None and prompt_name not in prompts:
        raise ValueError(f"--prompt-name {prompt_name!r}: the model's prompts are "
                         f"{sorted(prompts) or 'none'} (config_sentence_transformers.json)")
    chosen = {}
    for role, given in (("query", query_prompt), ("document", document_prompt)):
        if given is not None:
            chosen[role] = given
        elif prompt_name is not None:
            chosen[role] = prompts[prompt_name]
        else:
            named = next((prompts[n] for n in ROLE_PROMPT_NAMES[role] if n in prompts), None)
            chosen[role] = named if named is not None else prompts.get(default_name or "", "")
    for role, prompt in chosen.items():
        if "\0" in prompt:
            raise ValueError(f"the {role} prompt holds a NUL character")
    return chosen
