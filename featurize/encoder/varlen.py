"""Attention kept within each text of a packed batch: the varlen kernels and the attention function registered
with transformers under ATTENTION_NAME.

A kernel takes (T, H, d) q, k, v and the batch's `Pack` (offsets `cu_seqlens`) and returns (T, H, d): torch's
varlen_attn, the flash-attn package, SDPA on jagged nested tensors, or an SDPA per text (KERNELS, in order of
preference). The registered function reads the running forward's `Pack` from a thread-local set around it
(`active_pack`), so it does not depend on which keyword arguments a transformers version passes down; outside a
packed forward it is SDPA.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

ATTENTION_NAME = "headstore_varlen"
_ACTIVE = threading.local()  # .pack: the Pack of the forward running in this thread, else None


@dataclass
class Pack:
    """One packed forward's texts, as the kernels take them."""

    kernel: str
    cu_seqlens: torch.Tensor  # (B+1,) int32 on the device
    offsets: list[int]
    max_length: int
    calls: int = 0  # attention layers that ran packed (the probe checks every layer did)


def _sdpa_loop(q, k, v, pack: Pack, scale):
    out = torch.empty_like(q)
    for a, b in zip(pack.offsets[:-1], pack.offsets[1:]):
        out[a:b] = F.scaled_dot_product_attention(q[a:b].transpose(0, 1), k[a:b].transpose(0, 1),
                                                  v[a:b].transpose(0, 1), scale=scale).transpose(0, 1)
    return out


def _nested_sdpa(q, k, v, pack: Pack, scale):
    offsets = pack.cu_seqlens.to(torch.int64)
    lengths = np.diff(pack.offsets)

    def jagged(x):  # (T, H, d) -> (B, H, j, d)
        return torch.nested.nested_tensor_from_jagged(x, offsets, min_seqlen=int(lengths.min()),
                                                      max_seqlen=pack.max_length).transpose(1, 2)

    return F.scaled_dot_product_attention(jagged(q), jagged(k), jagged(v), scale=scale).transpose(1, 2).values()


def _torch_varlen(q, k, v, pack: Pack, scale):
    from torch.nn.attention.varlen import varlen_attn  # torch >= 2.9; its keywords changed between releases

    params = inspect.signature(varlen_attn).parameters
    kwargs = {"scale": scale} if "scale" in params else {}
    if "scale" not in params and scale is not None:
        q = q * (scale * q.shape[-1] ** 0.5)  # its fixed scale is 1/sqrt(d)
    out = varlen_attn(q, k, v, pack.cu_seqlens, pack.cu_seqlens, pack.max_length, pack.max_length, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def _flash_attn(q, k, v, pack: Pack, scale):
    from flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func(q, k, v, pack.cu_seqlens, pack.cu_seqlens, pack.max_length, pack.max_length,
                                  dropout_p=0.0, softmax_scale=scale, causal=False)


# in order of preference; sdpa_loop (exact, slow) is the CPU's and the last resort
KERNELS = {"varlen_attn": _torch_varlen, "flash_attn": _flash_attn, "nested_sdpa": _nested_sdpa,
           "sdpa_loop": _sdpa_loop}


CPU_KERNELS = ("sdpa_loop",)  # on the CPU: nested SDPA computes the same per-text maths, with more overhead


def varlen_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention-function signature; query (1, H, T, d) inside a packed forward, else SDPA."""
    pack = getattr(_ACTIVE, "pack", None)
    if pack is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if attention_mask is not None or query.shape[0] != 1:
        raise RuntimeError("packed forward got an attention mask or a batch dimension")  # the probe refuses
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (T, H, d)
    pack.calls += 1
    return KERNELS[pack.kernel](q, k, v, pack, scaling).unsqueeze(0), None  # (1, T, H, d)


@contextlib.contextmanager
def active_pack(pack: Pack):
    _ACTIVE.pack = pack
    try:
        yield pack
    finally:
        _ACTIVE.pack = None


def varlen_mask(*args, **kwargs):
    """The mask function of ATTENTION_NAME: none inside a packed forward (whatever a transformers version
    would build from packed position ids: a (T, T) mask is what packing avoids), else SDPA's."""
    if getattr(_ACTIVE, "pack", None) is not None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def register_attention() -> None:
    """ATTENTION_NAME in transformers' attention and mask registries."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, varlen_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, varlen_mask)


def use_attention(model, name: str) -> None:
    """The model's attention implementation, by transformers' setter where it takes the name, else the
    config attribute every attention module reads."""
    try:
        model.set_attn_implementation(name)
    except Exception:  # absent, or a version that refuses a registered name
        model.config._attn_implementation = name
    if model.config._attn_implementation != name:
        raise RuntimeError(f"could not set the attention implementation to {name}")


def kernel_works(name: str, device: torch.device, dtype: torch.dtype) -> bool:
    """The kernel runs here and matches the per-text SDPA (on random q, k, v of three texts)."""
    generator = torch.Generator().manual_seed(0)
    lengths = [5, 12, 3]
    q, k, v = (torch.randn(sum(lengths), 2, 16, generator=generator).to(device, dtype) for _ in range(3))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    pack = Pack(name, torch.tensor(offsets, dtype=torch.int32, device=device), offsets, max(lengths))
    try:
        out = KERNELS[name](q, k, v, pack, 0.25)
    except Exception:  # not installed, not on this device or dtype, another signature
        return False
    reference = _sdpa_loop(q.float(), k.float(), v.float(), pack, 0.25)
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    return out.shape == reference.shape and float((out.float() - reference).abs().max()) <= tolerance
