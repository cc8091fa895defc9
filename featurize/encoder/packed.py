"""Unpadded ("packed") batches and the encoder's numerics: the GPU featurize path.

A packed batch is its texts' real tokens concatenated into one (1, T) sequence, with position ids that restart
at 0 in each text and cumulative offsets `cu_seqlens` (B+1,). The encoder's attention is kept within each text
by an attention function registered with transformers (varlen.py: ATTENTION_NAME) that runs the first varlen
kernel (KERNELS) that works on the device and dtype. The hidden states are scattered back to (B, S, D) in fp32
and pooled by the same Pooler as a padded batch. `prepare_encoder` casts the weights (config.NUMERICS), checks
the architecture, picks the kernel and proves packed == padded on a probe batch before any text is encoded;
where anything fails the run keeps padded batches and says why (EncodePath.packing_reason).
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field

import numpy as np
import torch

from headstore.featurize.encoder.config import NUMERICS
from headstore.featurize.encoder.pooling import Pooler, pool_states
from headstore.featurize.encoder.varlen import (ATTENTION_NAME, CPU_KERNELS, KERNELS, Pack, active_pack, kernel_works,
                                                register_attention, use_attention)

# model types whose packed forward equals the padded one (tests/featurize/test_packed.py), and where their
# position ids start: 0, or after the padding index (RoBERTa family: padding_idx + 1 + position)
PACKABLE = {"bert": "zero", "electra": "zero", "distilbert": "zero", "roberta": "after_padding",
            "xlm-roberta": "after_padding"}
REFUSED = {"mpnet": "its attention adds a relative-position bias outside transformers' attention functions",
           "deberta-v2": "its disentangled attention does not use transformers' attention functions",
           "modernbert": "its sliding-window local attention and own unpadding are not handled here"}


@dataclass
class PackedLayout:
    """Host tensors of one packed batch (built in the collate thread, pinned on a GPU)."""

    lengths: torch.Tensor  # (B,) int64 tokens per text
    position_ids: torch.Tensor  # (1, T) int64 position within its text, from 0
    cu_seqlens: torch.Tensor  # (B+1,) int32 offset of each text in the sequence
    scatter_index: torch.Tensor  # (T,) int64 flat index of each token in the (B, S) padded layout
    offsets: list[int]  # cu_seqlens as ints (the per-text kernel slices by them without a device sync)
    max_length: int  # S: the longest text


def collate_packed(ids: list[np.ndarray], pin: bool) -> tuple[torch.Tensor, PackedLayout]:
    """(1, T) token ids of the texts back to back, and their layout."""
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))  # (B,)
    cu = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    positions = np.arange(cu[-1], dtype=np.int64) - np.repeat(cu[:-1], lengths)  # (T,)
    longest = int(lengths.max())
    scatter = np.repeat(np.arange(len(ids), dtype=np.int64) * longest, lengths) + positions  # (T,)
    tensors = [torch.from_numpy(np.concatenate(ids).astype(np.int64)[None]), torch.from_numpy(lengths),
               torch.from_numpy(positions[None]), torch.from_numpy(cu.astype(np.int32)), torch.from_numpy(scatter)]
    if pin:
        tensors = [t.pin_memory() for t in tensors]
    input_ids, lengths_t, positions_t, cu_t, scatter_t = tensors
    return input_ids, PackedLayout(lengths_t, positions_t, cu_t, scatter_t, cu.tolist(), longest)


@dataclass
class EncodePath:
    """How the encoder runs (put in the run summary)."""

    numerics: str  # a key of config.NUMERICS
    packing: bool = False
    packing_reason: str | None = None  # why batches stay padded where packing was asked for
    attention_kernel: str = "padded"
    position_offset: int = 0  # added to per-text positions (padding_idx + 1 for RoBERTa-style models)
    forward_args: frozenset = field(default_factory=frozenset)  # keyword args the model's forward takes

    @property
    def autocast(self) -> str:
        """The precision compute_context takes: bf16 autocast, or none (fp32 maths, or weights held in half)."""
        return "bf16" if NUMERICS[self.numerics][1] else "fp32"

    def summary(self) -> dict:
        return {"numerics": self.numerics, "packing": "on" if self.packing else "off",
                "packing_reason": self.packing_reason, "attention_kernel": self.attention_kernel}


def refusal(encoder) -> str | None:
    """Why this encoder cannot take packed batches (None: it can)."""
    model_type = getattr(encoder.model.config, "model_type", "")
    if model_type not in PACKABLE:
        return f"{model_type or 'this model'}: {REFUSED.get(model_type, 'not verified for packed batches')}"
    if encoder.attn_implementation != "sdpa":
        return f"{model_type}: loaded with {encoder.attn_implementation} attention, not sdpa"
    return None


def prepare_encoder(encoder, numerics: str, packing: bool, kernels: tuple[str, ...] | None = None):
    """Hold the weights in `numerics`' dtype (a config.NUMERICS key, resolved.ResolvedSettings.numerics), and
    switch to packed batches where `packing` asks for them and this encoder, device and transformers version give
    the padded path's features (a probe batch). Sets and returns `encoder.path` (an EncodePath). `kernels`: the
    varlen kernels to try (tests)."""
    weights, autocast = NUMERICS[numerics]
    path = encoder.path = EncodePath(numerics, forward_args=_forward_args(encoder))
    if packing:  # before the cast: the probe runs in fp32
        try:
            path.packing_reason = _switch_to_packing(encoder, path, kernels, getattr(torch, autocast or weights))
        except Exception as err:  # another transformers/torch API: padded batches, and say why
            path.packing_reason = f"packing failed to set up ({type(err).__name__}: {err})"
        if path.packing_reason is not None:
            path.packing, path.attention_kernel = False, "padded"
            with contextlib.suppress(Exception):  # best effort: outside a packed forward ours is SDPA anyway
                use_attention(encoder.model, encoder.attn_implementation)
    if weights != "float32":
        encoder.model.to(getattr(torch, weights))
    return path


def hold_numerics(encoder, numerics: str) -> EncodePath:
    """Padded batches in `numerics` (a config.NUMERICS key): the weights cast to its dtype, autocast where it
    says (EncodePath.autocast). Sets and returns `encoder.path`: how new text is encoded as a store's rows were
    (heads.apply.pipeline: numerics from resolved.store_numerics, whichever device runs it)."""
    path = encoder.path = EncodePath(numerics, forward_args=_forward_args(encoder))
    encoder.model.to(getattr(torch, NUMERICS[numerics][0]))
    return path


def _forward_args(encoder) -> frozenset:
    return frozenset(inspect.signature(encoder.model.forward).parameters)


def _switch_to_packing(encoder, path: EncodePath, kernels, dtype: torch.dtype) -> str | None:
    """Packed batches for this fp32 encoder, whose attention will run in `dtype`: the first kernel that
    matches the per-text SDPA in `dtype` on the device, and a probe of the model in fp32 (positions, masks,
    every layer packed; with the per-text kernel, so fp32 on any device). None, or why not."""
    reason = refusal(encoder)
    if reason is not None:
        return reason
    model = encoder.model
    device = next(model.parameters()).device
    candidates = kernels or (CPU_KERNELS if device.type == "cpu" else tuple(KERNELS))
    kernel = next((name for name in candidates if kernel_works(name, device, dtype)), None)
    if kernel is None:
        return f"no varlen attention kernel of {list(candidates)} runs on {device.type} in {dtype}"
    if "position_ids" not in path.forward_args:
        return f"{model.config.model_type}: its forward takes no position_ids"
    register_attention()
    use_attention(model, ATTENTION_NAME)
    after_padding = PACKABLE[model.config.model_type] == "after_padding"
    path.position_offset = int(model.config.pad_token_id) + 1 if after_padding else 0
    path.packing, path.attention_kernel = True, "sdpa_loop"
    reason = _probe(encoder, path)
    path.attention_kernel = kernel
    return reason


PROBE_TEXTS = ("a", "the quick brown fox jumps over the lazy dog , again and again", "hello world")


def _probe(encoder, path: EncodePath) -> str | None:
    """None when a packed forward of PROBE_TEXTS equals their padded forward in fp32 (within 1e-4 of the
    largest state) and every attention layer ran packed; else why not."""
    ids = [np.asarray(encoder.tokenizer(t)["input_ids"][: encoder.max_length], dtype=np.int64) for t in PROBE_TEXTS]
    device = next(encoder.model.parameters()).device
    longest = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), longest), encoder.tokenizer.pad_token_id or 0, dtype=torch.int64)  # (B, S)
    mask = torch.zeros((len(ids), longest), dtype=torch.int64)
    for b, x in enumerate(ids):
        input_ids[b, : len(x)], mask[b, : len(x)] = torch.from_numpy(x), 1
    with torch.inference_mode():
        padded = encoder.model(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                               return_dict=True).last_hidden_state.float()  # (B, S, D)
        packed_ids, layout = collate_packed(ids, pin=False)
        packed, calls = _packed_states(encoder, path, packed_ids, layout, (-1,))
    expected = torch.cat([padded[b, : len(x)] for b, x in enumerate(ids)])  # (T, D)
    layers = getattr(encoder.model.config, "num_hidden_layers", None) or getattr(encoder.model.config, "n_layers", 0)
    if calls == 0 or (layers and calls != layers):
        return f"packed forward ran {calls} of {layers} attention layers packed (this transformers version)"
    error = float((packed[0].float() - expected).abs().max() / expected.abs().max().clamp(min=1e-6))
    if not error <= 1e-4:
        return f"packed forward differs from the padded one by {error:.2g} of its scale (tolerance 1e-4)"
    return None


def _packed_states(encoder, path: EncodePath, input_ids: torch.Tensor, layout: PackedLayout,
                   layers: tuple[int, ...], non_blocking: bool = False) -> tuple[list[torch.Tensor], int]:
    """Hidden states of `layers` of one packed batch, each (T, D) in the model's dtype; attention calls."""
    model = encoder.model
    device = next(model.parameters()).device
    input_ids = input_ids.to(device, non_blocking=non_blocking)  # (1, T)
    args = {"position_ids": layout.position_ids.to(device, non_blocking=non_blocking) + path.position_offset}
    if "token_type_ids" in path.forward_args:  # explicit: some versions slice a buffer of max_positions
        args["token_type_ids"] = torch.zeros_like(input_ids)
    want_hidden = tuple(layers) != (-1,)
    pack = Pack(path.attention_kernel, layout.cu_seqlens.to(device, non_blocking=non_blocking),
                 layout.offsets, layout.max_length)
    with active_pack(pack):
        out = model(input_ids=input_ids, attention_mask=None, output_hidden_states=want_hidden, return_dict=True,
                    **args)
    hidden = [out.hidden_states[layer][0] for layer in layers] if want_hidden else [out.last_hidden_state[0]]
    return hidden, pack.calls


def packed_forward(encoder, input_ids: torch.Tensor, layout: PackedLayout, pooler: Pooler,
                   layers: tuple[int, ...], prompt_lengths: torch.Tensor | None) -> list[torch.Tensor]:
    """pooling.pooled_forward for a packed batch: one float32 (B, D) tensor per layer. The states are
    scattered back to (B, S, D) in fp32 and pooled as a padded batch is (the same maths, deterministic on a
    GPU, where a segment sum by index_add_ is not: a resumed run must give bit-identical rows)."""
    from headstore.featurize.encoder.pooling import compute_context

    path = encoder.path
    device_type = next(encoder.model.parameters()).device.type
    cuda = device_type == "cuda"  # host tensors are pinned there: copies need not wait
    with compute_context(device_type, path.autocast):
        hidden, _ = _packed_states(encoder, path, input_ids, layout, layers, non_blocking=cuda)  # [(T, D)]
    device = hidden[0].device
    lengths = layout.lengths.to(device, non_blocking=cuda)  # (B,)
    scatter = layout.scatter_index.to(device, non_blocking=cuda)  # (T,)
    B, S = len(layout.offsets) - 1, layout.max_length
    mask = (torch.arange(S, device=device).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int64)  # (B, S)
    padded = []
    for h in hidden:
        flat = torch.zeros(B * S, h.shape[1], dtype=torch.float32, device=device)
        flat[scatter] = h.float()
        padded.append(flat.view(B, S, -1))  # (B, S, D)
    return pool_states(pooler, padded, layers, mask, prompt_lengths)
