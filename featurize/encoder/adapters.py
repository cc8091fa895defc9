"""Bottleneck adapters (Houlsby et al. 2019) inside a frozen encoder, inserted with forward hooks.

Each transformer layer gets two adapters: one on the attention's output projection and one on the
feed-forward's output projection (featurize.encoder.architectures names both per architecture), each
`x + up(relu(down(x)))` with down: Linear(d, m), up: Linear(m, d), applied before the sublayer's residual
and LayerNorm, as in Houlsby's placement. `up` starts at zero, so an encoder with fresh adapters computes
exactly what the base computes.

Why hooks: AdapterHub's `adapters` library (1.3.0) pins transformers ~=4.57 and cannot join this
project's transformers 5, and PEFT has no bottleneck adapter (its LoRA / IA3 / prefix methods are other
things). A forward hook on the projection's Linear adds the adapter without touching transformers' code or
the base weights, on every architecture in the table.

An encoder folder with adapters holds the base model's files unchanged plus ADAPTER_WEIGHTS (safetensors) and
ADAPTER_CONFIG (json); `load_encoder` attaches them when it loads such a folder, and the folder's
weights_hash (every *.safetensors in it) covers the adapter weights, so its stores get their own fingerprint.
Plain sentence-transformers / transformers would load only the base weights of such a folder.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from headstore.featurize.encoder.architectures import layout_of, transformer_layers

ADAPTER_WEIGHTS = "headstore_adapters.safetensors"
ADAPTER_CONFIG = "headstore_adapters.json"
FORMAT = "headstore-bottleneck-adapters/1"
CHILD = "headstore_adapters"  # the ModuleDict each layer carries: {"attention": Bottleneck, "ffn": Bottleneck}
DOWN_INIT_STD = 1e-2  # near-identity start (Houlsby); with `up` at zero the start is exactly the base


class Bottleneck(torch.nn.Module):
    """x + up(relu(down(x))): (..., d) -> (..., d)."""

    def __init__(self, dim: int, size: int):
        super().__init__()
        self.down = torch.nn.Linear(dim, size)
        self.up = torch.nn.Linear(size, dim)
        torch.nn.init.normal_(self.down.weight, std=DOWN_INIT_STD)
        torch.nn.init.zeros_(self.down.bias)
        torch.nn.init.zeros_(self.up.weight)
        torch.nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d)
        return x + self.up(torch.relu(self.down(x)))


class _AfterProjection:
    """A forward hook: the projection's output -> the adapter's output (replaces it)."""

    def __init__(self, adapter: Bottleneck):
        self.adapter = adapter

    def __call__(self, module, args, output):
        return self.adapter(output)


def has_adapters(model_dir: str | Path) -> bool:
    return (Path(model_dir) / ADAPTER_CONFIG).is_file()


def attach_adapters(model, size: int) -> list[torch.nn.ModuleDict]:
    """Add fresh adapters (bottleneck width `size`) to every layer of `model`, in place; returns each layer's
    ModuleDict, bottom first. They sit on the layer as child CHILD, so `model.to(...)` moves and casts them."""
    layout, layers = layout_of(model), transformer_layers(model)
    if any(hasattr(layer, CHILD) for layer in layers):
        raise ValueError("the encoder already carries bottleneck adapters; start from the base encoder")
    found = []
    for layer in layers:
        attention_out, ffn_out = layer.get_submodule(layout.attention_out), layer.get_submodule(layout.ffn_out)
        pair = torch.nn.ModuleDict({"attention": Bottleneck(attention_out.out_features, size),
                                    "ffn": Bottleneck(ffn_out.out_features, size)})
        ref = next(attention_out.parameters())
        pair.to(device=ref.device, dtype=ref.dtype)
        layer.add_module(CHILD, pair)
        attention_out.register_forward_hook(_AfterProjection(pair["attention"]))
        ffn_out.register_forward_hook(_AfterProjection(pair["ffn"]))
        found.append(pair)
    return found


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The adapters' weights, keyed `<layer>.<attention|ffn>.<down|up>.<weight|bias>`."""
    return {f"{i}.{k}": v.detach().to("cpu", torch.float32).contiguous()
            for i, layer in enumerate(transformer_layers(model)) for k, v in getattr(layer, CHILD).state_dict().items()}


def save_adapters(model, folder: str | Path, size: int) -> None:
    """Write ADAPTER_WEIGHTS and ADAPTER_CONFIG into `folder` (the base model's files are written apart)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    save_file(adapter_state(model), str(folder / ADAPTER_WEIGHTS))
    config = {"format": FORMAT, "size": size, "model_type": model.config.model_type,
              "layers": len(transformer_layers(model)), "placement": ["attention_out", "ffn_out"],
              "block": "x + up(relu(down(x)))"}
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=1) + "\n")


def attach_saved(model, folder: str | Path) -> None:
    """Attach the adapters saved in `folder` to `model` (the base encoder loaded from the same folder)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{folder / ADAPTER_CONFIG}: cannot read the adapters' settings ({err})") from None
    if config.get("format") != FORMAT:
        raise ValueError(f"{folder / ADAPTER_CONFIG}: format {config.get('format')!r}, expected {FORMAT!r}")
    pairs = attach_adapters(model, int(config["size"]))
    weights = load_file(str(folder / ADAPTER_WEIGHTS))
    if len(weights) != sum(len(p.state_dict()) for p in pairs):
        raise ValueError(f"{folder / ADAPTER_WEIGHTS}: {len(weights)} tensors do not match the model's "
                         f"{len(pairs)} layers of adapters of size {config['size']}")
    for i, pair in enumerate(pairs):
        prefix = f"{i}."
        pair.load_state_dict({k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)})
