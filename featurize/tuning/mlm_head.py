"""Loading an encoder with its masked-language-model head, and saving the two apart.

Sentence encoders such as all-MiniLM-L6-v2 ship without the MLM head (`cls.predictions.*`).
`load_mlm_model` detects that from the loading report and initialises the head itself, from a
seeded generator (so two loads with the same seed get the same head), with the output projection
tied to the input embeddings as in BERT. An adapted output directory keeps its trained head beside
the encoder in `mlm_head.safetensors`, which `load_mlm_model` picks up.

Head status values: "pretrained" (the checkpoint had a head), "adapted" (loaded from
mlm_head.safetensors), "initialised" (fresh random head: MLM numbers mean nothing about the encoder).
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

log = logging.getLogger(__name__)

HEAD_FILE = "mlm_head.safetensors"
HEAD_STATUSES = ("pretrained", "adapted", "initialised")


def head_parameters(model) -> dict[str, torch.nn.Parameter]:
    """The MLM head's own parameters: everything outside the base encoder, minus the decoder
    weight when it is the (tied) input embedding matrix."""
    prefix = model.base_model_prefix + "."
    embedding = model.get_input_embeddings().weight
    return {name: p for name, p in model.named_parameters()
            if not name.startswith(prefix) and p is not embedding}


def tie_decoder(model) -> None:
    """Make the head's output projection the input embedding matrix (BERT's weight tying)."""
    output, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    assert output is not None, f"{type(model).__name__} has no output embeddings"
    if output.weight is not embedding.weight:
        output.weight = embedding.weight


def init_head(model, seed: int) -> None:
    """Fresh head from `seed`: dense weights ~ N(0, initializer_range), biases 0, LayerNorm 1/0."""
    generator = torch.Generator().manual_seed(seed)
    std = float(getattr(model.config, "initializer_range", 0.02))
    tie_decoder(model)
    with torch.no_grad():
        for name, p in sorted(head_parameters(model).items()):
            if "LayerNorm" in name or "layer_norm" in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif p.dim() >= 2:
                p.copy_(torch.normal(0.0, std, size=p.shape, generator=generator))
            else:
                p.zero_()


def load_mlm_model(model_dir: str | Path, seed: int = 0):
    """(AutoModelForMaskedLM, head_status). Safetensors only; never remote code."""
    from transformers import AutoModelForMaskedLM
    from transformers.utils import logging as hf_logging

    model_dir = Path(model_dir)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its missing-head report is replaced by ours below
    try:
        model, info = AutoModelForMaskedLM.from_pretrained(
            model_dir, use_safetensors=True, trust_remote_code=False, output_loading_info=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    prefix = model.base_model_prefix + "."
    missing = sorted(k for k in info["missing_keys"] if not k.startswith(prefix))
    missing_base = sorted(k for k in info["missing_keys"] if k.startswith(prefix))
    if missing_base:
        raise ValueError(f"{model_dir}: the checkpoint lacks encoder weights {missing_base[:5]}; "
                         "is it a BERT-family masked-language model?")
    if not missing:
        tie_decoder(model)
        return model, "pretrained"
    head_file = model_dir / HEAD_FILE
    if head_file.is_file():
        tie_decoder(model)
        saved = load_file(head_file)
        expected = head_parameters(model)
        if set(saved) != set(expected):
            raise ValueError(f"{head_file}: holds {sorted(saved)}, but the model's head is "
                             f"{sorted(expected)}")
        with torch.no_grad():
            for name, p in expected.items():
                p.copy_(saved[name])
        return model, "adapted"
    init_head(model, seed)
    log.warning("%s has NO masked-language-model head (missing %s): initialised a fresh head "
                "(seed %d) with its decoder tied to the input embeddings", model_dir,
                ", ".join(missing), seed)
    return model, "initialised"


def save_head(model, out_dir: Path) -> Path:
    tensors = {n: p.detach().cpu().contiguous().clone() for n, p in head_parameters(model).items()}
    path = Path(out_dir) / HEAD_FILE
    save_file(tensors, str(path), metadata={"format": "pt", "decoder": "tied to input embeddings"})
    return path


def _source_tensors(source_dir: Path, names: list[str], prefix: str) -> dict[str, torch.Tensor]:
    """Tensors `names` (base-model names) from the source checkpoint, with or without prefix."""
    found = {}
    for file in sorted(source_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            keys = set(f.keys())
            for name in names:
                for key in (name, prefix + name):
                    if key in keys and name not in found:
                        found[name] = f.get_tensor(key)
    return found


def save_encoder(model, source_dir: str | Path, out_dir: str | Path, seed: int = 0) -> None:
    """Save the base encoder of an MLM model as a plain `AutoModel` checkpoint in `out_dir`.

    Parts the MLM model does not carry (BERT's pooler) are copied from the source checkpoint, so
    `AutoModel.from_pretrained(out_dir)` loads without newly initialised weights; if the source
    has none either they are initialised from `seed`.
    """
    from transformers import AutoModel

    torch.manual_seed(seed)  # only for parts absent from both the model and the source
    encoder = AutoModel.from_config(model.config)
    result = encoder.load_state_dict(model.base_model.state_dict(), strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    if result.missing_keys:
        prefix = model.base_model_prefix + "."
        copied = _source_tensors(Path(source_dir), list(result.missing_keys), prefix)
        if copied:
            encoder.load_state_dict(copied, strict=False)
        absent = sorted(set(result.missing_keys) - set(copied))
        if absent:
            log.info("%s: source has no %s; saved seeded initial values", source_dir, absent)
    encoder.config.architectures = [type(encoder).__name__]
    encoder.save_pretrained(str(out_dir))


def masked_lm_loss(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy at the predicted positions only.

    BERT's own forward decodes every position into vocabulary logits; only ~15% are predicted, so
    running the head (for MiniLM a 384 x 30522 projection, ~20% of a step) on those alone is
    cheaper. Models without BERT's `cls` head module fall back to the full forward.
    """
    import torch.nn.functional as F

    predicted = labels != -100  # (B, T)
    head = getattr(model, "cls", None)
    if head is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                               ignore_index=-100, reduction=reduction)
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask)[0]  # (B, T, H)
    logits = head(hidden[predicted])  # (N, V)
    return F.cross_entropy(logits.float(), labels[predicted], reduction=reduction)
