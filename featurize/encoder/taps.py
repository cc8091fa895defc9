"""Taps: what each transformer layer computes on the way, mean-pooled per text, stored beside the features
(`cli featurize --taps`; Head2Toe's intermediate features, Evci et al. 2022).

Per layer i (1 = the bottom block, as `hidden_states[i]` counts) three taps, each read by a forward hook on the
module the architecture table (featurize.encoder.architectures) names, in the same forward pass as the features:

    attn   the attention's output projection (d wide), before its residual: what attention adds to the stream
    mlp    the feed-forward's intermediate activations (d_ff wide): the input of its output projection
    block  the layer's output (d wide): the hidden state `--layers i` stores

Each is mean-pooled over the text's pooled tokens (the features' mask: padding and a left-out prompt excluded),
in float32. A store's `taps` fingerprint part (`tap_part`) holds the kinds, the pooling, the number of layers and
each kind's width, so the store's arrays (`tap_arrays`) follow from the part alone.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Callable, Sequence

import torch

from headstore.featurize.encoder.architectures import ARCHITECTURES, Layout, layout_of, transformer_layers

TAPS_VERSION = 1  # bump when what a tap holds changes (the module hooked, the pooling)
TAP_POOLING = "mean"
TAP_PREFIX = "tap_"


def _attention_output(layer: torch.nn.Module, layout: Layout):
    return layer.get_submodule(layout.attention_out), "output"


def _mlp_intermediate(layer: torch.nn.Module, layout: Layout):
    return layer.get_submodule(layout.ffn_out), "input"


def _block_output(layer: torch.nn.Module, layout: Layout):
    return layer, "output"


# kind -> (the module a hook reads in one layer, and whether its input or output is the tap)
TAP_KINDS: dict[str, Callable[[torch.nn.Module, Layout], tuple[torch.nn.Module, str]]] = {
    "attn": _attention_output, "mlp": _mlp_intermediate, "block": _block_output}
# config.json keys of the feed-forward's width (BERT family; DistilBERT)
_FFN_WIDTH = ("intermediate_size", "hidden_dim")
_HIDDEN = ("hidden_size", "dim", "d_model")
_N_LAYERS = ("num_hidden_layers", "n_layers")


def _config_value(config: dict, names: Sequence[str], file: Path) -> int:
    for name in names:
        if name in config:
            return int(config[name])
    raise ValueError(f"{file}: none of {list(names)}; cannot size the taps")


def tap_part(model_dir: str | Path) -> dict:
    """The `taps` fingerprint part of a store of taps of the model in `model_dir` (its config.json alone)."""
    file = Path(model_dir) / "config.json"
    config = json.loads(file.read_text())
    if config.get("model_type") not in ARCHITECTURES:
        raise ValueError(f"--taps: architecture {config.get('model_type')!r} has no tap sites "
                         f"(supported: {sorted(ARCHITECTURES)})")
    hidden = _config_value(config, _HIDDEN, file)
    dims = {"attn": hidden, "mlp": _config_value(config, _FFN_WIDTH, file), "block": hidden}
    return {"kinds": list(TAP_KINDS), "pooling": TAP_POOLING, "n_layers": _config_value(config, _N_LAYERS, file),
            "dims": dims, "version": TAPS_VERSION}


def tap_name(kind: str, layer: int) -> str:
    return f"{TAP_PREFIX}{kind}_{layer}"


def tap_arrays(part: dict | None) -> dict[str, dict]:
    """{array name: {"tap": kind, "layer": i, "dim": width}} of a store's taps part, layer by layer (none for None)."""
    if not part:
        return {}
    return {tap_name(kind, i): {"tap": kind, "layer": i, "dim": int(part["dims"][kind])}
            for i in range(1, int(part["n_layers"]) + 1) for kind in part["kinds"]}


def parse_tap(name: str) -> tuple[str, int]:
    """`tap_mlp_3` -> ("mlp", 3); ValueError naming the valid form."""
    kind, _, layer = name.removeprefix(TAP_PREFIX).rpartition("_")
    if not name.startswith(TAP_PREFIX) or kind not in TAP_KINDS or not layer.isdigit():
        raise ValueError(f"{name!r} is not a tap array (tap_<kind>_<layer>, kind one of {sorted(TAP_KINDS)})")
    return kind, int(layer)


@contextlib.contextmanager
def recording(model, taps: Sequence[tuple[str, int]]):
    """Forward hooks that keep each (kind, layer) tap's (B, S, D) tensor of the forward passes inside the block:
    yields {(kind, layer): tensor} (the last pass's). No taps: no hooks."""
    if not taps:
        yield {}
        return
    layers, layout = transformer_layers(model), layout_of(model)
    got: dict[tuple[str, int], torch.Tensor] = {}
    handles = []
    for kind, i in taps:
        if not 1 <= i <= len(layers):
            raise ValueError(f"tap layer {i} out of range for a {len(layers)}-layer model (1..{len(layers)})")
        module, side = TAP_KINDS[kind](layers[i - 1], layout)
        if side == "input":
            handles.append(module.register_forward_pre_hook(
                lambda m, args, key=(kind, i): got.__setitem__(key, args[0])))
        else:
            handles.append(module.register_forward_hook(
                lambda m, args, out, key=(kind, i): got.__setitem__(key, out[0] if isinstance(out, tuple) else out)))
    try:
        yield got
    finally:
        for handle in handles:
            handle.remove()
