"""bench/speed/featurize.py's command line: its options, the defaults it completes per device, the names it accepts,
and the settings they make each worker run.

The per-device defaults are filled in after parsing (the device is known only then: --device, or CUDA's
presence): DEFAULTS and QUICK below are the values a run gets for the options left unset.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import featurize_data as fd

SYSTEMS = ("headstore", "sentence-transformers")
DEFAULTS = {  # per device: (headstore settings, ST precisions, ST batch sizes, ST fp32 batch sizes)
    "cuda": ("bf16,bf16:packing=off,fp16,bf16-autocast,fp32", "bf16,fp16,fp32", "32,64,128,256,512", "128"),
    "cpu": ("fp32,fp32:backend=onnx,fp32:backend=openvino,bf16,bf16:backend=openvino", "fp32,bf16",
            "32,64,128", "32,64,128"),
}
QUICK = {"cuda": ("bf16,fp32", "bf16,fp16", "128,256", "128"), "cpu": ("fp32", "fp32", "32", "32")}


def build_parser(description: str) -> argparse.ArgumentParser:
    """The benchmark's options; description is featurize.py's docstring (what `--help` prints first)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--model", default="minilm", help="the minilm shape: 'minilm' or a model dir")
    ap.add_argument("--shapes", default="minilm,bert-base,bert-large", help=f"of {sorted(fd.SHAPES)}")
    ap.add_argument("--texts", default="main,scifact512", help=f"of {list(fd.TEXT_SETS)}")
    ap.add_argument("--systems", default="headstore,sentence-transformers")
    ap.add_argument("--limit", type=int, default=None, help="texts per set, spread over the length order")
    ap.add_argument("--data", default=os.environ.get(
        "HEADSTORE_DATA", str(Path(__file__).resolve().parents[2].parent / "shared" / "datasets")))
    ap.add_argument("--hs", default=None, help="headstore settings: precision[:packing=on|off][:backend=X][:batch=N],...")
    ap.add_argument("--precisions", default=None,
                    help="shorthand (the earlier benchmark's flag): --hs and --st-precisions both these, torch only")
    ap.add_argument("--st-precisions", default=None)
    ap.add_argument("--st-batch-sizes", default=None)
    ap.add_argument("--st-fp32-batch-sizes", default=None, help="fp32 is never ST's best on a GPU: fewer sizes")
    ap.add_argument("--st-attn", default="sdpa,flash_attention_2", help="GPU: attn_implementation values")
    ap.add_argument("--st-backends", default="torch,onnx,openvino", help="CPU: sentence-transformers backends")
    ap.add_argument("--st-python", default=sys.executable,
                    help="interpreter of the sentence-transformers workers: a venv where its onnx/openvino "
                         "backends install (optimum needs transformers < 5.6; the worker needs no headstore)")
    ap.add_argument("--cpu-bf16", action="store_true", help="run bf16 on a CPU without native bf16 too")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--ref-sample", type=int, default=None, help="texts compared with the fp32 reference")
    ap.add_argument("--warmup-texts", type=int, default=None)
    ap.add_argument("--budget-s", type=float, default=None, help="begin no setting after this many seconds")
    ap.add_argument("--grace-s", type=float, default=120.0,
                    help="a worker still running this long after the budget is stopped (its finished settings kept)")
    ap.add_argument("--quick", action="store_true", help="a small matrix: few settings, one repeat")
    ap.add_argument("--json", default=None)
    return ap


def complete_defaults(args: argparse.Namespace, device: str) -> None:
    """Fill, in place, every option left unset with its default for the device (QUICK under --quick): the
    settings of both systems, the repeats and text limit of a quick run, the reference and warm-up sizes."""
    gpu = device == "cuda"
    defaults = (QUICK if args.quick else DEFAULTS)[device]
    if args.precisions:
        args.hs, args.st_precisions, args.st_backends = args.hs or args.precisions, args.precisions, "torch"
    args.hs = args.hs or defaults[0]
    args.st_precisions = args.st_precisions or defaults[1]
    args.st_batch_sizes = args.st_batch_sizes or defaults[2]
    args.st_fp32_batch_sizes = args.st_fp32_batch_sizes or defaults[3]
    if args.quick:
        args.repeats = 1
        args.limit = args.limit or (2000 if gpu else 100)
    args.ref_sample = args.ref_sample or (256 if gpu else 16 if args.quick else 32)
    args.warmup_texts = args.warmup_texts or (1024 if gpu else 16 if args.quick else 64)


def check_names(shapes: list[str], systems: list[str]) -> None:
    """A ValueError listing the valid names for the first unknown --shapes or --systems item."""
    for shape in shapes:
        if shape not in fd.SHAPES:
            raise ValueError(f"--shapes: {shape!r} not valid; choose from {sorted(fd.SHAPES)}")
    for system in systems:
        if system not in SYSTEMS:
            raise ValueError(f"--systems: {system!r} not valid; choose from {list(SYSTEMS)}")


def parse_settings(text: str) -> list[dict]:
    """'bf16,fp32:packing=off:batch=8192' -> [{'precision': 'bf16'}, {'precision': 'fp32', 'packing': 'off',
    'batch': 8192}]."""
    out = []
    for item in filter(None, text.split(",")):
        precision, *pairs = item.split(":")
        setting = {"precision": precision}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or key not in ("packing", "backend", "batch"):
                raise ValueError(f"--hs item {item!r}: take precision[:packing=..][:backend=..][:batch=N]")
            setting[key] = int(value) if key == "batch" else value
        out.append(setting)
    return out


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def settings_for(system: str, text_set: str, args, device: str, bf16_native: bool) -> list[dict]:
    """The settings one worker runs for one text set, in the order they run. bf16 on a CPU without native bf16
    (no AMX / AVX-512-BF16) is emulated, minutes per run and never the best: such settings carry "skip" (reported,
    not run) unless --cpu-bf16."""
    emulated = device == "cpu" and not (bf16_native or args.cpu_bf16)
    mark = {"skip": "bf16 is emulated on this CPU (no AMX / AVX-512-BF16); --cpu-bf16 runs it"}
    if system == "headstore":
        return [{"system": system, "text_set": text_set, **s, **(mark if emulated and s["precision"] == "bf16" else {})}
                for s in parse_settings(args.hs)]
    out = []
    backends = args.st_backends.split(",") if device == "cpu" else ["torch"]
    attns = args.st_attn.split(",") if device == "cuda" else [None]
    for precision in args.st_precisions.split(","):
        sizes = ints(args.st_fp32_batch_sizes if precision == "fp32" else args.st_batch_sizes)
        for backend in backends:
            if backend == "onnx" and precision != "fp32":
                continue
            for attn in attns:
                for batch in sizes:
                    out.append({"system": system, "text_set": text_set, "precision": precision,
                                "backend": backend, "attn": attn, "batch": batch,
                                **(mark if emulated and precision == "bf16" else {})})
    return out
