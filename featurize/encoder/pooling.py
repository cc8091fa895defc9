"""Poolings: one vector per text from a (B, S, D) hidden state and its (B, S) attention mask, and
`pooled_forward`, the one encoder-forward-then-pool step every caller shares.

All poolings are mask-aware: padding positions never contribute. Computed in float32 whatever the
model's compute dtype, so autocast does not cost pooled precision.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import load

from headstore.featurize.encoder.sentence import POOLING_MODES, SentenceSpec
from headstore.featurize.encoder.taps import recording


def pooling_mask(mask: torch.Tensor, prompt_lengths: torch.Tensor | None) -> torch.Tensor:
    """The (B, S) mask of the tokens pooled: the attention mask, with each text's first `prompt_lengths[i]`
    tokens left out (a Pooling with include_prompt=False; texts are padded on the right)."""
    if prompt_lengths is None:
        return mask
    positions = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)  # (1, S)
    return mask.masked_fill(positions < prompt_lengths.to(mask.device).unsqueeze(1), 0)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Average of the hidden states of real (mask == 1) tokens. (B, S, D), (B, S) -> (B, D)."""
    weights = mask.to(torch.float32).unsqueeze(-1)  # (B, S, 1)
    summed = (hidden.to(torch.float32) * weights).sum(dim=1)  # (B, D)
    counts = weights.sum(dim=1).clamp(min=1.0)  # (B, 1); an all-padding row gives 0, not NaN
    return summed / counts


def mean_sqrt_len_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of the real tokens' states over the square root of their number (sentence-transformers'
    mean_sqrt_len_tokens)."""
    weights = mask.to(torch.float32).unsqueeze(-1)  # (B, S, 1)
    summed = (hidden.to(torch.float32) * weights).sum(dim=1)
    return summed / weights.sum(dim=1).clamp(min=1e-9).sqrt()


def weighted_mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean weighted by position 1, 2, ... S (later tokens count more; right padding)."""
    positions = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=torch.float32)  # (S,)
    weights = mask.to(torch.float32) * positions  # (B, S)
    summed = (hidden.to(torch.float32) * weights.unsqueeze(-1)).sum(dim=1)  # (B, D)
    return summed / weights.sum(dim=1, keepdim=True).clamp(min=1e-9)


def cls_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Hidden state of the first pooled token: [CLS] for BERT, the first token after a left-out prompt."""
    first = mask.to(torch.int32).argmax(dim=1)  # (B,); 0 for an all-zero row
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), first].to(torch.float32)


def last_token_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Hidden state of the last pooled token (decoder-style embedders); zeros for an all-zero row."""
    S = hidden.shape[1]
    found, from_end = mask.flip(1).max(dim=1)  # (B,), (B,)
    last = torch.where(found == 0, torch.full_like(from_end, S - 1), S - 1 - from_end)
    picked = hidden[torch.arange(hidden.shape[0], device=hidden.device), last].to(torch.float32)  # (B, D)
    return picked * (found != 0).to(torch.float32).unsqueeze(-1)


def max_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-dimension maximum over real tokens; padding is set to -inf so it never wins."""
    hidden = hidden.to(torch.float32)
    padding = (mask == 0).unsqueeze(-1)  # (B, S, 1)
    return hidden.masked_fill(padding, float("-inf")).amax(dim=1)  # (B, D)


# sentence-transformers' Pooling modes (featurize.encoder.sentence.POOLING_MODES names them, torch-free)
POOLINGS = {"mean": mean_pool, "cls": cls_pool, "max": max_pool, "mean_sqrt_len_tokens": mean_sqrt_len_pool,
            "weightedmean": weighted_mean_pool, "lasttoken": last_token_pool}
assert sorted(POOLINGS) == sorted(POOLING_MODES), "featurize.encoder.sentence lists the pooling modes implemented here"
ACTIVATION_FUNCTIONS = {"identity": lambda x: x, "tanh": torch.tanh, "relu": torch.relu,
                        "gelu": torch.nn.functional.gelu, "sigmoid": torch.sigmoid, "silu": torch.nn.functional.silu}


class Pooler:
    """A store's sentence embedding applied to hidden states: the Pooling modes (concatenated), then, on the
    last layer, the model's Dense layers (fp32). A final Normalize is applied on read, not here."""

    def __init__(self, spec: SentenceSpec, dense: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]):
        self.spec, self.dense = spec, dense  # dense: (weight (out, in), bias (out,) | None, residual weight | None)

    @classmethod
    def of(cls, spec: SentenceSpec | str, model_dir=None) -> "Pooler":
        """The Pooler of a spec (or of a bare mode name); Dense weights from model_dir, checked by sha256."""
        spec = SentenceSpec((spec,)) if isinstance(spec, str) else spec
        dense = []
        for d in spec.dense:
            file = Path(model_dir) / d.path / "model.safetensors"
            data = file.read_bytes()
            if hashlib.sha256(data).hexdigest() != d.sha256:
                raise ValueError(f"{file}: not the Dense weights the store was made with (sha256 differs)")
            tensors = load(data)
            dense.append((tensors["linear.weight"].float(), tensors.get("linear.bias"), tensors.get("residual.weight")))
        return cls(spec, dense)

    def __call__(self, hidden: torch.Tensor, mask: torch.Tensor, last_layer: bool) -> torch.Tensor:
        """(B, S, D) hidden states and (B, S) pooling mask -> (B, D') float32."""
        pooled = [POOLINGS[mode](hidden, mask) for mode in self.spec.modes]
        x = pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=-1)
        if not last_layer:
            return x
        for (weight, bias, residual), d in zip(self.dense, self.spec.dense):
            out = ACTIVATION_FUNCTIONS[d.activation](torch.nn.functional.linear(
                x, weight.to(x.device), None if bias is None else bias.float().to(x.device)))
            if d.residual:
                out = out + (x if residual is None else x @ residual.float().to(x.device).T)
            x = out
        return x


def compute_context(device_type: str, precision: str):
    """Autocast to bfloat16 for precision "bf16" (matmuls in bf16, reductions kept in fp32), to float16 for
    "fp16" (a Pipeline over a store whose encoder held fp16 weights), else plain float32."""
    assert precision in ("fp32", "bf16", "fp16"), precision
    if precision != "fp32":
        return torch.autocast(device_type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
    return contextlib.nullcontext()


def pooled_forward(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, pooling: "Pooler | str",
                   layers: tuple[int, ...] = (-1,), precision: str = "fp32",
                   prompt_lengths: torch.Tensor | None = None, taps: Sequence[tuple[str, int]] = ()) -> list[torch.Tensor]:
    """THE encode-and-pool step (featurize, finetune and Pipeline all call it): the encoder's hidden
    states of `layers`, pooled by `pooling` (a Pooler, or a mode name), one float32 (B, D) tensor per layer,
    then one per tap of `taps` ((kind, layer) pairs, featurize.encoder.taps), mean-pooled over the same tokens.

    `attention_mask` None means no text of the batch is padded (the encoder then takes its fast
    unmasked path, and mean pooling is a plain mean). `prompt_lengths` (B,): prompt tokens to leave out
    of the pooling where the model's Pooling says include_prompt=False (the attention still sees them).
    Gradients flow unless the caller disables them (featurize runs it under `torch.inference_mode`,
    finetune trains through it)."""
    pooler = pooling if isinstance(pooling, Pooler) else Pooler.of(pooling)
    want_hidden = tuple(layers) != (-1,)
    with compute_context(input_ids.device.type, precision), recording(model, taps) as tapped:
        out = model(input_ids=input_ids, attention_mask=attention_mask,
                    output_hidden_states=want_hidden, return_dict=True)
    hidden = [out.hidden_states[layer] for layer in layers] if want_hidden else [out.last_hidden_state]
    tap_states = [tapped[tap] for tap in taps]  # (B, S, D_tap) each
    if pooler.spec.include_prompt:
        prompt_lengths = None
    if attention_mask is None and prompt_lengths is None and pooler.spec.modes == ("mean",) and not pooler.dense:
        return [h.to(torch.float32).mean(dim=1) for h in hidden + tap_states]  # no padding: a plain mean, no temporary
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    pooled = pool_states(pooler, hidden, layers, mask, prompt_lengths)
    return pooled + [mean_pool(h, pooling_mask(mask, prompt_lengths)) for h in tap_states]


def pool_states(pooler: Pooler, hidden: list[torch.Tensor], layers: tuple[int, ...], mask: torch.Tensor,
                prompt_lengths: torch.Tensor | None) -> list[torch.Tensor]:
    """Each layer's (B, S, D) states pooled under the (B, S) attention mask, less the prompts where the
    Pooling leaves them out; Dense layers apply where they were trained: the last layer."""
    if pooler.spec.include_prompt:
        prompt_lengths = None
    mask = pooling_mask(mask, prompt_lengths)
    return [pooler(h, mask, layer == -1) for h, layer in zip(hidden, layers)]
