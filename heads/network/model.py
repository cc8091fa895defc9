"""Stacked MLP heads: H independent small MLPs whose parameters carry a leading head axis.

Layer l of every head is one `(H, in, out)` weight and one `(H, out)` bias, so a forward pass over all
H heads is one batched matmul per layer (`torch.baddbmm`).

A head over several stored encoder layers (`mix = L > 1`) takes their concatenation `(B, L * D)`, each
layer already normalised on its own, and mixes them with its own learned softmax weights (a scalar mix
per head, as ELMo's): `x = normalize(sum_l softmax(w)_l x_l)`, then the MLP on `x`. The first array
(the last layer, `features`) starts with weight `mix_init`, the others share the rest. With `mix_mode` "concat" the
head reads the concatenation itself (its first layer is L x as wide; no mix weights, no residual). Head h is
initialised from its own seed
exactly like a one-head stack built with that seed, so training H heads stacked equals training
them one by one (with dropout 0: dropout masks are drawn for the whole stack at once and differ from
the masks separate runs would draw).
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
from dataclasses import asdict
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save
from safetensors import safe_open

from headstore.data.files import atomic_write_bytes
from headstore.data.text_id import ROLES
from headstore.heads.settings.config import ACTIVATION_NAMES, HeadConfig

ACTIVATIONS = {
    "gelu": F.gelu,
    "relu": F.relu,
    "tanh": torch.tanh,
    "identity": lambda x: x,
}
assert sorted(ACTIVATIONS) == sorted(ACTIVATION_NAMES), "heads.settings.config lists the activations the model implements"
# the mix weights are softmax(MIX_GAIN * theta): Adam moves theta by ~lr per step whatever its gradient's
# size, so without a gain the mix would barely move from its start in a few hundred steps (on STS-B a gain
# of 10 lets it move from 0.8 to ~0.73 on the last layer; docs/l1-energy.md)
MIX_GAIN = 10.0
MASK_STREAM = 0x5EED  # added to a head's seed for its dropout masks' generator: a stream apart from its init's
MASK_RULE = 2  # how dropout masks are drawn (a grid head with dropout holds it in its id): 2, each head's own seeded
# generator (1, before: torch's unseeded global one, a seed did not give the same head twice)
HEADS_FORMAT = "headstore.heads/1"  # safetensors metadata tag; bump when the layout changes


def autocast(precision: str, device: str | torch.device = "cpu"):
    """The context head maths run in: "bf16" = torch.autocast to bfloat16 (the matmuls run in bf16, the
    parameters stay fp32 and elementwise maths follow autocast's rules); "fp32" = no context."""
    if precision == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    if precision != "fp32":
        raise ValueError(f"precision={precision!r}; valid: ['bf16', 'fp32']")
    return contextlib.nullcontext()


def _check_buildable(cfg: HeadConfig) -> None:
    if cfg.in_dim is None or cfg.in_dim < 1:
        raise ValueError(f"HeadConfig.in_dim must be set to the feature dim (got {cfg.in_dim})")
    if cfg.array_dropout > 0 and len(cfg.array_bounds()) < 3:
        raise ValueError(f"array_dropout {cfg.array_dropout} drops arrays beside the first: it needs several arrays "
                         "read side by side (--array A+B+... --mix-mode concat)")
    if cfg.mix_mode == "concat" and cfg.mix > 1 and cfg.residual and cfg.depth > 0:
        raise ValueError(f"a head reading its {cfg.mix} arrays side by side (mix_mode 'concat') has no one input to add "
                         f"back: use --no-residual (a grid: residual = false), or --mix-mode scalar")
    leading = cfg.mix_mode == "concat" and cfg.mix == 1 and cfg.out_features < cfg.in_dim  # arrays of several widths
    if cfg.residual and cfg.depth > 0 and cfg.out_features != cfg.in_dim and not leading:
        raise ValueError(f"residual heads need out_dim == in_dim ({cfg.in_dim}), or, reading arrays of several widths "
                         f"side by side, out_dim = the first array's width; got out_dim={cfg.out_dim}")
    if cfg.sides == "query" and (cfg.out_features != cfg.in_dim or cfg.mix > 1):
        raise ValueError(f"a query-side head (sides='query') compares f(q) with a document's own features, so it needs "
                         f"out_dim == in_dim ({cfg.in_dim}) and one stored array; got out_dim={cfg.out_dim}, "
                         f"{cfg.mix} arrays")
    if cfg.init == "identity" and (cfg.depth != 1 or cfg.out_dim not in (None, cfg.input_width)):
        raise ValueError(f"init='identity' needs depth 1 and out_dim == the input's width ({cfg.input_width}); "
                         f"got depth={cfg.depth}, out_dim={cfg.out_dim}")


def _init_stack(cfg: HeadConfig, seeds: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(weights (H, in, out), biases (H, out)) of every layer; head h's drawn from its own generator (seed h): per
    layer, its weight then its bias, uniform on [-1, 1) / sqrt(fan_in) (the distribution nn.Linear's
    reset_parameters gives). A residual head's last layer starts at 0 (f(x) = x exactly) and init "identity" is
    W = I: such a last layer is set, not drawn (nothing is drawn after it). The draws land in the stacked tensors and
    are scaled there, one pass per layer for every head: each head's numbers are those a one-head stack draws."""
    dims = cfg.layer_dims()
    layers = [(torch.empty(len(seeds), i, o), torch.empty(len(seeds), o)) for i, o in zip(dims[:-1], dims[1:])]
    set_last = bool(layers) and (cfg.residual or cfg.init == "identity")
    drawn = layers[:len(layers) - set_last]
    for h, seed in enumerate(seeds):
        gen = torch.Generator().manual_seed(int(seed))
        for w, b in drawn:
            torch.rand(w.shape[1:], generator=gen, out=w[h])
            torch.rand(b.shape[1:], generator=gen, out=b[h])
    for (w, b), fan_in in zip(drawn, dims):
        bound = 1.0 / math.sqrt(fan_in)
        w.mul_(2).sub_(1).mul_(bound)
        b.mul_(2).sub_(1).mul_(bound)
    if set_last:
        w, b = layers[-1]
        w.copy_(torch.eye(dims[0]) if cfg.init == "identity" and not cfg.residual else torch.zeros(()))
        b.zero_()
    return layers


class StackedMLP(nn.Module):
    """H heads f_h: (B, D) shared or (H, B, D) per-head input -> (H, B, out_features)."""

    def __init__(self, n_heads: int, cfg: HeadConfig, seeds: Optional[Sequence[int]] = None):
        super().__init__()
        _check_buildable(cfg)
        seeds = list(range(n_heads)) if seeds is None else [int(s) for s in seeds]
        if n_heads < 1 or len(seeds) != n_heads:
            raise ValueError(f"need n_heads >= 1 and one seed per head; got n_heads={n_heads}, {len(seeds)} seeds")
        self.n_heads, self.cfg, self.seeds = n_heads, cfg, seeds
        layers = _init_stack(cfg, seeds)  # [layer] -> (w (H, in, out), b (H, out))
        self.weights = nn.ParameterList([nn.Parameter(w) for w, _ in layers])
        self.biases = nn.ParameterList([nn.Parameter(b) for _, b in layers])
        if self.scalar_mix:  # theta of the scalar mix, (H, L): softmax(MIX_GAIN * theta) starts at mix_init on array 0
            theta = torch.zeros(n_heads, cfg.mix)
            theta[:, 0] = math.log(cfg.mix_init * (cfg.mix - 1) / (1 - cfg.mix_init)) / MIX_GAIN
            self.mix_logits = nn.Parameter(theta)
        n_norms = max(cfg.depth - 1, 0) if cfg.layer_norm else 0
        self.ln_weights = nn.ParameterList([nn.Parameter(torch.ones(n_heads, cfg.hidden)) for _ in range(n_norms)])
        self.ln_biases = nn.ParameterList([nn.Parameter(torch.zeros(n_heads, cfg.hidden)) for _ in range(n_norms)])
        self.mask_gens: Optional[list[torch.Generator]] = None  # per head, its dropout masks' (dropout_masks)

    @property
    def out_features(self) -> int:
        return self.cfg.out_features

    @property
    def scalar_mix(self) -> bool:
        """Whether the head mixes several arrays into one by learned softmax weights (not read side by side)."""
        return self.cfg.mix > 1 and self.cfg.mix_mode == "scalar"

    def mix_weights(self) -> torch.Tensor:
        """(H, L) softmax weights of the stored arrays each head mixes (ones (H, 1) without a scalar mix)."""
        if not self.scalar_mix:
            return torch.ones(self.n_heads, 1, device=next(self.parameters(), torch.empty(0)).device)
        return torch.softmax(MIX_GAIN * self.mix_logits, dim=-1)

    def mixed_input(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L*D) or (H, B, L*D) concatenated arrays -> (H, B, D): each head's L2-normalised scalar mix."""
        H, L, D = self.n_heads, self.cfg.mix, self.cfg.in_dim
        layers = x.unflatten(-1, (L, D))  # (..., B, L, D)
        w = self.mix_weights().view(H, 1, L, 1)  # (H, 1, L, 1)
        return F.normalize((w * layers).sum(-2), dim=-1)  # (H, B, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        H, cfg = self.n_heads, self.cfg
        width = cfg.in_dim * cfg.mix
        if x.dim() not in (2, 3) or x.shape[-1] != width or (x.dim() == 3 and x.shape[0] != H):
            raise ValueError(f"StackedMLP input must be (B, {width}) or ({H}, B, {width}); got {tuple(x.shape)}")
        if self.scalar_mix:
            x = self.mixed_input(x)
        elif x.dim() == 2:
            x = x.unsqueeze(0).expand(H, *x.shape)  # shared input, a view: (H, B, D)
        act = ACTIVATIONS[cfg.activation]
        h = self.dropped_arrays(x) if self.training and cfg.array_dropout > 0 else x
        for l in range(cfg.depth):
            h = torch.baddbmm(self.biases[l].unsqueeze(1), h, self.weights[l])  # (H, B, out_l)
            if l < cfg.depth - 1:
                if cfg.layer_norm:
                    h = F.layer_norm(h, h.shape[-1:]) * self.ln_weights[l].unsqueeze(1) + self.ln_biases[l].unsqueeze(1)
                h = act(h)
                if self.training and cfg.dropout > 0:
                    h = h * self.dropout_masks(h.shape[-2:], cfg.dropout, h)
        # a residual head adds its input back; one narrower than its input (arrays of several widths side by side,
        # out_dim the first's) adds back the leading columns: the first array (taps: `features`)
        return x[..., :h.shape[-1]] + h if cfg.residual and cfg.depth > 0 else h

    def dropped_arrays(self, x: torch.Tensor) -> torch.Tensor:
        """(H, B, W) input with each array but the first zeroed, whole, per head and text, with probability
        array_dropout, the kept ones scaled by 1 / (1 - p) (the residual adds back the first array, never dropped)."""
        bounds, p = self.cfg.array_bounds(), self.cfg.array_dropout
        keep = self.dropout_masks((x.shape[-2], len(bounds) - 2), p, x)  # (H, B, A-1)
        dropped = [x[..., a:b] * keep[..., j:j + 1] for j, (a, b) in enumerate(zip(bounds[1:-1], bounds[2:]))]
        return torch.cat([x[..., :bounds[1]], *dropped], dim=-1)  # (H, B, W): one pass, not a (H, B, W) mask

    def dropout_masks(self, shape: tuple, p: float, like: torch.Tensor) -> torch.Tensor:
        """(H, *shape) dropout masks in `like`'s dtype and device: 0 with probability p, else 1 / (1 - p). Head h's
        are drawn from its own generator (its seed + MASK_STREAM, made on first use where `like` is), so a head's
        masks are those it draws alone, the same in every run of its seed."""
        if self.mask_gens is None or self.mask_gens[0].device != like.device:
            self.mask_gens = [torch.Generator(device=like.device).manual_seed(s + MASK_STREAM) for s in self.seeds]
        draws = torch.stack([torch.rand(shape, generator=g, device=like.device) for g in self.mask_gens])
        return (draws >= p).to(like.dtype) / (1 - p)

    def encode(self, x: torch.Tensor, role: str = "query") -> torch.Tensor:
        """(B, D) or (H, B, D) features of texts in `role` -> (H, B, out_features). A query-side head
        (cfg.sides "query") passes documents through unchanged (a view of x, the same numbers bit for bit):
        only queries move, so a document index made once serves every such head."""
        if role not in ROLES:
            raise ValueError(f"role {role!r}; valid: {list(ROLES)}")
        if role == "document" and self.cfg.sides == "query":
            return x.unsqueeze(0).expand(self.n_heads, *x.shape) if x.dim() == 2 else x
        return self(x)

    def select_heads(self, heads: Sequence[int]) -> "StackedMLP":
        """A new stack holding copies of the given heads, in that order."""
        idx = torch.as_tensor(list(heads), dtype=torch.long)
        out = StackedMLP(len(idx), self.cfg, seeds=[self.seeds[i] for i in idx.tolist()])
        with torch.no_grad():
            for name, p in self.named_parameters():
                out.get_parameter(name).copy_(p.detach().index_select(0, idx.to(p.device)))
        if self.mask_gens is not None:  # the heads' dropout streams go on where they were
            out.mask_gens = [copy.deepcopy(self.mask_gens[i]) for i in idx.tolist()]
        return out.to(next(self.parameters(), torch.empty(0)).device)

    def head_slice(self, h: int) -> "StackedMLP":
        """Head h alone as a one-head stack (a copy)."""
        if not 0 <= h < self.n_heads:
            raise ValueError(f"head {h} out of range 0..{self.n_heads - 1}")
        return self.select_heads([h])


def outputs_inputs(model: StackedMLP) -> bool:
    """Whether every head of the stack gives back its input, bit for bit, at its current weights: a residual head on
    one array whose last layer is all zeros (how a residual head starts: f(x) = x + 0). Its outputs on finite
    features are the features themselves, so they need no forward pass (the start's dev score: the features')."""
    cfg = model.cfg
    if not (cfg.residual and cfg.depth > 0 and cfg.mix == 1 and cfg.out_features == cfg.in_dim):
        return False
    return not (bool(model.weights[-1].detach().any()) or bool(model.biases[-1].detach().any()))


def start_of(model: StackedMLP) -> StackedMLP:
    """The stack's starting point: the same heads as initialised from their seeds (what training began at)."""
    return StackedMLP(model.n_heads, model.cfg, seeds=model.seeds).to(next(model.parameters()).device)


def save_heads(path, model: StackedMLP, cfg: Optional[HeadConfig] = None) -> None:
    """Write the stack's parameters to safetensors (atomically) with the HeadConfig, seeds and H in the metadata."""
    cfg = model.cfg if cfg is None else cfg
    if cfg != model.cfg:
        raise ValueError(f"save_heads: cfg {cfg} differs from the model's {model.cfg}")
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    meta = {"format": HEADS_FORMAT, "head_config": json.dumps(asdict(cfg)),
            "n_heads": str(model.n_heads), "seeds": json.dumps(model.seeds)}
    atomic_write_bytes(path, save(tensors, metadata=meta))


def load_heads(path, device: str | torch.device = "cpu") -> StackedMLP:
    """Rebuild a StackedMLP saved by `save_heads` (config from the metadata, weights from the file)."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("format") != HEADS_FORMAT:
        raise ValueError(f"{path}: not a headstore heads file (metadata format={meta.get('format')!r}, "
                         f"expected {HEADS_FORMAT!r})")
    cfg = HeadConfig(**json.loads(meta["head_config"]))
    model = StackedMLP(int(meta["n_heads"]), cfg, seeds=json.loads(meta["seeds"]))
    model.load_state_dict(load_file(str(path)), strict=True)
    return model.to(device)
