"""The encoder exported for a CPU runtime (ONNX for ONNX Runtime, OpenVINO IR), cached on disk.

An export is a pure function of the model's files, the layers asked for and the libraries that made it,
so it is cached under a key hashing all of them (`export_key`): another model, config.json, tokenizer,
layer set, opset, torch/transformers/onnx/openvino version, or this module's EXPORT_VERSION gives another
folder, never a stale export. A folder is written as `<name>.incomplete-<pid>` and renamed when complete;
its manifest.json holds the sha256 of every file, checked on every use, so a truncated or corrupted
file is rebuilt (one line on stderr), not loaded. It also keeps the export's parity check against torch
(featurize.encoder.backends.parity: what makes a runtime provably exact for this model), run once per export.

The ONNX graph is torch's TorchScript-based ONNX exporter (torch.onnx.export(dynamo=False)): it traces the
loaded transformers model (its SDPA attention, the same maths as the torch path) with dynamic batch and
sequence axes in 1-10 s, where the dynamo exporter took 30-60 s per tiny model on this 2-core box; both
gave the torch path's states within 1e-6 on every architecture tested (tests/featurize/test_backends.py).
The OpenVINO IR comes from OpenVINO's own PyTorch frontend (ov.convert_model on the same traced module, as
optimum-intel does), not from the ONNX file: it keeps each SDPA call as one ScaledDotProductAttention op,
which the CPU plugin runs as a fused kernel, where the ONNX route decomposes it into MatMul/Softmax plus
IsNaN/Select guards (MiniLM: 12% fewer ops, the attention no longer materialised). Weights kept f32
(`compress_to_fp16=False`: exact).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from headstore.data.files import atomic_write_json
from headstore.data.keys import library_version

EXPORT_VERSION = 2  # bump when the exported graph changes (inputs, outputs, wrapper); 2: OpenVINO from torch
OPSET = 17  # LayerNormalization is one op from 17: ONNX Runtime and OpenVINO fuse it
INPUTS = ("input_ids", "attention_mask")
MANIFEST = "manifest.json"
# the files of each format; the key's libraries: what made (or converts) them
FILES = {"onnx": ("model.onnx",), "openvino": ("model.xml", "model.bin")}
LIBRARIES = {"onnx": ("torch", "transformers", "onnx"), "openvino": ("torch", "transformers", "openvino")}


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/headstore/exports, else ~/.cache/headstore/exports."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "headstore" / "exports"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def export_key(encoder, fmt: str, layers: tuple[int, ...]) -> dict:
    """Everything that decides the exported files' contents."""
    identity = encoder.identity
    config_json = Path(identity.model_dir) / "config.json"
    return {"format": fmt, "export_version": EXPORT_VERSION, "opset": OPSET, "weights": "float32",
            "weights_hash": identity.weights_hash, "tokenizer_hash": identity.tokenizer_hash,
            "config_sha256": _sha256(config_json) if config_json.is_file() else None,
            "attn_implementation": encoder.attn_implementation, "layers": list(layers),
            "libraries": {name: library_version(name) for name in LIBRARIES[fmt]}}


def _folder(root: Path, encoder, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in encoder.identity.model_id)[-40:]
    return root / f"{name}-{key['format']}-{digest}"


def verified(folder: Path, key: dict) -> str | None:
    """None when `folder` holds a complete export for `key` (every file's sha256 as recorded), else why not."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return "absent"
    try:
        recorded = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return f"{manifest}: unreadable"
    if recorded.get("key") != key:
        return f"{manifest}: made for another key"
    for name in FILES[key["format"]]:
        file = folder / name
        if not file.is_file() or _sha256(file) != recorded.get("files", {}).get(name):
            return f"{file}: missing or not the file exported (sha256 differs)"
    return None


def export_folder(encoder, fmt: str, layers: tuple[int, ...], root: str | Path | None = None) -> tuple[Path, dict]:
    """(the folder an export of `encoder` giving `layers` lives in, its key): nothing is read or built."""
    root = Path(root) if root else default_cache_dir()
    key = export_key(encoder, fmt, layers)
    return _folder(root, encoder, key), key


def is_cached(encoder, fmt: str, layers: tuple[int, ...], root: str | Path | None = None) -> bool:
    """Whether a verified export is already there (`--backend auto` builds one only where it pays: backends)."""
    return verified(*export_folder(encoder, fmt, layers, root)) is None


def recorded_parity(folder: Path) -> dict | None:
    """The parity check recorded with a verified export (featurize.encoder.backends.parity), None before one ran."""
    parity = json.loads((folder / MANIFEST).read_text()).get("parity")
    return parity if isinstance(parity, dict) and "max_abs_diff" in parity else None


def record_parity(folder: Path, parity: dict) -> None:
    """Keep `parity` in the export's manifest (atomically; the key and the files' sha256 unchanged), so the check
    runs once per export, not once per run."""
    recorded = json.loads((folder / MANIFEST).read_text())
    atomic_write_json(folder / MANIFEST, {**recorded, "parity": parity}, sort_keys=True)


def cached_export(encoder, fmt: str, layers: tuple[int, ...], root: str | Path | None = None) -> Path:
    """The folder of a verified `fmt` export of `encoder` giving `layers` ("onnx": model.onnx, "openvino":
    model.xml/.bin), built (and any corrupted one rebuilt) where needed."""
    folder, key = export_folder(encoder, fmt, layers, root)
    why = verified(folder, key)
    if why is None:
        return folder
    if why != "absent":
        print(f"headstore: rebuilding the {fmt} export ({why})", file=sys.stderr, flush=True)
    tmp = folder.with_name(f"{folder.name}.incomplete-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _export_or_refuse(encoder, fmt, layers, tmp)
        files = {name: _sha256(tmp / name) for name in FILES[fmt]}
        atomic_write_json(tmp / MANIFEST, {"key": key, "files": files}, sort_keys=True)
        _publish(tmp, folder, key)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _publish(tmp: Path, folder: Path, key: dict) -> None:
    """Rename the complete `tmp` to `folder`; a folder another process published meanwhile is kept if it
    verifies, replaced if not."""
    if folder.exists() and verified(folder, key) is None:
        return
    shutil.rmtree(folder, ignore_errors=True)
    try:
        os.rename(tmp, folder)
    except OSError:
        if verified(folder, key) is not None:  # not a concurrent writer's good export: a real failure
            raise


def _export_or_refuse(encoder, fmt: str, layers: tuple[int, ...], folder: Path) -> None:
    """export_onnx or export_openvino into `folder`, or one ValueError naming the architecture the exporter
    cannot trace."""
    try:
        if fmt == "onnx":
            export_onnx(encoder.model, _example_inputs(encoder), layers, folder / "model.onnx")
        else:
            export_openvino(encoder.model, _example_inputs(encoder), layers, folder)
    except Exception as err:
        model_type = getattr(encoder.model.config, "model_type", None) or "this model"
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        target = "ONNX" if fmt == "onnx" else "OpenVINO"
        raise ValueError(f"{model_type}: cannot be exported to {target} ({type(err).__name__}: {first}); "
                         "use --backend torch") from None


def _example_inputs(encoder):
    """A padded batch of two real texts: the trace takes the masked attention path (an all-ones example
    could let a model skip its mask in the traced graph)."""
    batch = encoder.tokenizer(["an example text to trace the encoder with", "short"], padding=True,
                              return_tensors="pt")
    return batch["input_ids"], batch["attention_mask"]


def states_module(model, layers: tuple[int, ...]):
    """`model` as a module of (input_ids, attention_mask) -> the states of `layers` (`last_hidden_state` for
    (-1,), else hidden_states[layer] in order; each (B, S, D) float32): what both exporters trace."""
    import torch

    class States(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             output_hidden_states=tuple(layers) != (-1,), return_dict=True)
            if tuple(layers) == (-1,):
                return (out.last_hidden_state,)
            return tuple(out.hidden_states[layer] for layer in layers)

    return States().eval()


def export_onnx(model, example: tuple, layers: tuple[int, ...], path: Path) -> None:
    """Write `model` as ONNX: inputs input_ids, attention_mask (B, S) int64; outputs the states of `layers`."""
    import torch

    axes = {"batch": 0, "tokens": 1}
    names = [f"states_{i}" for i in range(len(layers))]
    dynamic = {name: {i: axis for axis, i in axes.items()} for name in (*INPUTS, *names)}
    with torch.no_grad(), _quiet_exporter():
        torch.onnx.export(states_module(model, layers), example, str(path), dynamo=False, input_names=list(INPUTS),
                          output_names=names, dynamic_axes=dynamic, opset_version=OPSET, do_constant_folding=True)


class _quiet_exporter:
    """The TorchScript exporter's deprecation and tracer warnings are about the exporter, not the user's run."""

    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)


def export_openvino(model, example: tuple, layers: tuple[int, ...], folder: Path) -> None:
    """Write `model` as OpenVINO IR (model.xml/.bin, weights f32) through OpenVINO's PyTorch frontend: inputs
    input_ids, attention_mask (B, S) int64, both axes dynamic; outputs the states of `layers` in order."""
    import openvino as ov
    import torch

    with torch.no_grad(), _quiet_exporter():
        converted = ov.convert_model(states_module(model, layers), example_input=dict(zip(INPUTS, example)))
    for port, name in zip(converted.inputs, INPUTS):
        port.get_tensor().set_names({name})
    if any(not port.get_partial_shape().is_dynamic for port in converted.inputs):  # the frontend keeps them dynamic
        converted.reshape({name: ov.PartialShape([-1, -1]) for name in INPUTS})  # any batch, any length
    ov.save_model(converted, str(folder / "model.xml"), compress_to_fp16=False)
