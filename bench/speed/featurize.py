"""Benchmark: headstore featurize against sentence-transformers at its best, on one device, in one run.

    python bench/speed/featurize.py --device cuda --json runs/bench-featurize-gpu.json
    python bench/speed/featurize.py --device cpu --shapes minilm --limit 2000 --json runs/bench-featurize-cpu.json
    python bench/speed/featurize.py --device cpu --quick --model TINY_DIR --shapes minilm   # a smoke run

Matrix: model shapes (--shapes: minilm = the offline weights or --model DIR; bert-base, bert-large = random
weights of those shapes with MiniLM's tokenizer) x text sets (--texts: main = the main job's 36,371 texts at
the model's max length, scifact512 = the SciFact corpus at 512 tokens; bench/speed/featurize_data.py) x systems:
  headstore              `featurize_texts` as `cli featurize` runs it, one setting per --hs item
                         (precision[:key=value...], keys: packing, backend, batch; settings this checkout's
                         FeaturizeConfig lacks are reported as unavailable, not failed)
  sentence-transformers  SentenceTransformer.encode, weights cast to fp16/bf16 (model.half()/.bfloat16()),
                         each --st-batch-sizes, attention per --st-attn (GPU), backend per --st-backends (CPU:
                         torch, onnx, openvino where installed); fp32 on a GPU only at --st-fp32-batch-sizes
Every system and shape runs in a fresh process (bench/speed/featurize_worker.py); every setting is warmed up and
timed --repeats times, the best kept. Per run: real tokens/s, padded/real tokens, share of the matmul ceiling
measured in this run (bench/speed/limits.py: bf16 on a GPU, fp32 on a CPU; probed before and after, best kept),
peak device memory (CPU: peak RSS), headstore's tokenizer and encoder tokens/s (its run summary), and the
max |diff| of unit rows against an fp32 reference (plain transformers, padded, on the same device) on
--ref-sample texts spread over the length order. --budget-s bounds the run: settings not begun by then are
reported as skipped, and the tables and JSON are still written.

FLOPs per text: 2 L (4 H^2 + 2 H I) n + 4 L H n^2 for n real tokens (featurize_data.flops_per_text).
"""

from __future__ import annotations

import os

ENV_AT_START = dict(os.environ)  # before `headstore` is imported (importing featurize sets OMP_WAIT_POLICY)

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import featurize_data as fd  # noqa: E402
import featurize_report as report  # noqa: E402

WORKER = Path(__file__).resolve().parent / "featurize_worker.py"
SYSTEMS = ("headstore", "sentence-transformers")
DEFAULTS = {  # per device: (headstore settings, ST precisions, ST batch sizes, ST fp32 batch sizes)
    "cuda": ("bf16,bf16:packing=off,fp16,bf16-autocast,fp32", "bf16,fp16,fp32", "32,64,128,256,512", "128"),
    "cpu": ("fp32,fp32:backend=onnx,fp32:backend=openvino,bf16,bf16:backend=openvino", "fp32,bf16",
            "32,64,128", "32,64,128"),
}
QUICK = {"cuda": ("bf16,fp32", "bf16,fp16", "128,256", "128"), "cpu": ("fp32", "fp32", "32", "32")}


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


def run_worker(spec: dict, folder: Path, name: str, env: dict, grace_s: float, python: str) -> list[dict]:
    """One worker process; its results (each with its features of the reference sample, or None). Past the
    deadline no worker starts; a worker still running grace_s after it is stopped (its finished settings kept)."""
    if time.time() > spec["deadline"]:
        return [{"index": i, **s, "status": "skipped", "reason": "time budget", "features": None}
                for i, s in enumerate(spec["settings"])]
    path = folder / f"{name}.json"
    path.write_text(json.dumps(spec))
    argv = [python, str(WORKER), str(path)] + (["--st-first"] if spec["system"] != "headstore" else [])
    timeout = max(30.0, spec["deadline"] - time.time() + grace_s)  # a setting begun in time may finish
    with open(folder / f"{name}.log", "w") as log:
        try:
            proc = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
            failed, reason = proc.returncode != 0, f"worker failed (exit {proc.returncode}; see its log)"
        except subprocess.TimeoutExpired:
            failed, reason = True, "time budget (worker stopped)"
    out = Path(f"{path}.out.json")
    results = json.loads(out.read_text()) if out.is_file() else []
    for r in results:
        npy = Path(f"{path}.{r['index']}.npy")
        r["features"] = np.load(npy) if npy.is_file() else None
    if failed:
        tail = (folder / f"{name}.log").read_text()[-1500:]
        print(f"  worker {name} stopped early:\n{tail}", file=sys.stderr, flush=True)
        done = {r["index"] for r in results}
        results += [{"index": i, **s, "status": "failed", "reason": reason, "features": None}
                    for i, s in enumerate(spec["settings"]) if i not in done]
    meta = Path(f"{path}.meta.json")
    if meta.is_file():
        for r in results:
            r.update(json.loads(meta.read_text()))
    return results


def log(t_start: float, message: str) -> None:
    print(f"  [{time.time() - t_start:5.0f} s] {message}", file=sys.stderr, flush=True)


def device_name(device: str) -> str:
    """The card (nvidia-smi: name, driver) or the CPU (lscpu's model name and its avx512/amx flags)."""
    if device == "cuda":
        try:
            return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            import torch

            return torch.cuda.get_device_name()
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    flags = [f for f in fields.get("Flags", "").split() if f.startswith(("avx512", "amx"))]
    return f"{fields.get('Model name', '?').strip()} ({os.cpu_count()} cores; {' '.join(flags) or 'no avx512/amx'})"


def prepare_text_sets(args, minilm_dir: str, max_len: int) -> dict:
    """Per text set: texts (cut by --limit over the length order), n_tokens, the reference sample."""
    from headstore.featurize.encoder.model import position_limit

    cells = {}
    for name in args.texts.split(","):
        texts = fd.read_text_set(name, Path(args.data))
        length = fd.text_set_length(name, max_len, position_limit(Path(minilm_dir)))
        n_tokens, _ = fd.tokenizer_counts(minilm_dir, texts, length)
        keep = fd.spread(n_tokens, args.limit)
        texts, n_tokens = [texts[i] for i in keep], n_tokens[keep]
        _, tokenizer_speed = fd.tokenizer_counts(minilm_dir, texts, length)  # warm: the tokenizer alone
        cells[name] = {"texts": texts, "n_tokens": n_tokens, "max_length": length,
                       "sample": fd.spread(n_tokens, args.ref_sample).tolist(),
                       "real_tokens": int(n_tokens.sum()), "tokenizer_alone_tokens_per_s": round(tokenizer_speed)}
    return cells


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    args = ap.parse_args()

    import limits
    import torch

    from headstore.featurize.encoder.hardware import native_bf16
    from headstore.featurize.encoder.model import model_identity, resolve_model

    t_start = time.time()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
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
    deadline = t_start + args.budget_s if args.budget_s else float("inf")
    shapes, systems = args.shapes.split(","), args.systems.split(",")
    for shape in shapes:
        if shape not in fd.SHAPES:
            raise ValueError(f"--shapes: {shape!r} not valid; choose from {sorted(fd.SHAPES)}")
    for system in systems:
        if system not in SYSTEMS:
            raise ValueError(f"--systems: {system!r} not valid; choose from {list(SYSTEMS)}")
    bf16_native = native_bf16()
    ceiling_precision = "bf16" if gpu else "fp32"

    minilm_dir = resolve_model(args.model)
    max_len = model_identity(args.model).max_length
    cells = prepare_text_sets(args, minilm_dir, max_len)
    log(t_start, "text sets read: " + ", ".join(f"{n} {len(c['texts']):,}" for n, c in cells.items()))
    probes = [limits.probe([ceiling_precision], device)]
    if gpu:
        torch.cuda.empty_cache()  # the probe's matrices: the workers' peak memory is theirs alone anyway
    log(t_start, f"matmul probe: {probes[0]}")
    folder = Path(tempfile.mkdtemp(prefix="bench-featurize-"))
    for name, cell in cells.items():
        (folder / f"texts-{name}.json").write_text(json.dumps(cell["texts"]))
    rows, reference_seconds = [], {}
    try:
        for shape in shapes:
            if time.time() > deadline:  # no model built, no reference: every setting is reported as skipped
                rows += [report.make_row({**s, "status": "skipped", "reason": s.get("skip", "time budget")}, shape,
                                         cells[n], None, None, 1.0)
                         for system in systems for n in cells for s in settings_for(system, n, args, device, bf16_native)]
                continue
            model_dir = fd.make_shape(shape, minilm_dir, folder)
            refs = {}
            for name, cell in cells.items():
                cell["flops"] = float(fd.flops_per_text(model_dir, cell["n_tokens"]).sum())
                t0 = time.perf_counter()
                refs[name] = fd.reference(model_dir, [cell["texts"][i] for i in cell["sample"]],
                                          cell["max_length"], device)
                reference_seconds[f"{shape}/{name}"] = round(time.perf_counter() - t0, 2)
            log(t_start, f"{shape}: fp32 references done")
            for system in systems:
                settings = [s for name in cells for s in settings_for(system, name, args, device, bf16_native)]
                rows += [report.make_row({**{k: v for k, v in s.items() if k != "skip"}, "status": "skipped",
                                          "reason": s["skip"]}, shape, cells[s["text_set"]], None, None, 1.0)
                         for s in settings if "skip" in s]
                settings = [s for s in settings if "skip" not in s]
                if not settings:
                    continue
                spec = {"system": system, "model_dir": model_dir, "device": device, "repeats": args.repeats,
                        "deadline": deadline if deadline != float("inf") else 1e18, "settings": settings,
                        "text_sets": {n: {"texts": str(folder / f"texts-{n}.json"), "sample": c["sample"],
                                          "max_length": c["max_length"], "warmup": args.warmup_texts}
                                      for n, c in cells.items()}}
                log(t_start, f"{shape} {system}: {len(settings)} settings")
                python = args.st_python if system == "sentence-transformers" else sys.executable
                for r in run_worker(spec, folder, f"{shape}-{system}", dict(ENV_AT_START), args.grace_s, python):
                    feats = r.pop("features")
                    rows.append(report.make_row(r, shape, cells[r["text_set"]], refs[r["text_set"]], feats,
                                                max(p[ceiling_precision] for p in probes)))
        probes.append(limits.probe([ceiling_precision], device))
        ceiling = limits.best_of(*probes)[ceiling_precision]
        for r in rows:  # shares against the best probe of the run (the first probe may have been unlucky)
            if r["status"] == "ok":
                r["share_of_ceiling"] = round(r["gflop_per_s"] / ceiling, 4)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    machine = limits.machine(device)
    name = device_name(device)
    ratios = report.speedups(rows)
    print(f"\n## featurize benchmark, {device}: {name}")
    print(limits.machine_line(machine))
    print(f"{ceiling_precision} matmul ceiling: {ceiling:,.0f} GFLOP/s (best of the probes before and after); "
          f"load average {os.getloadavg()[0]:.1f}; {time.time() - t_start:.0f} s in all")
    for n, c in cells.items():
        print(f"{n}: {len(c['texts']):,} texts, {c['real_tokens']:,} real tokens at max {c['max_length']}, "
              f"tokenizer alone {c['tokenizer_alone_tokens_per_s']:,} tok/s")
    report.print_table(rows)
    report.print_speedups(ratios)
    measured_goals = report.goals(rows, ratios, device)
    report.print_goals(measured_goals)
    if args.json:
        result = {"device": device, "device_name": name, "machine": machine, "args": vars(args),
                  "ceiling_precision": ceiling_precision, "ceiling_gflop_per_s": ceiling, "matmul_probes": probes,
                  "text_sets": {n: {k: v for k, v in c.items() if k not in ("texts", "n_tokens", "sample")}
                                | {"n_texts": len(c["texts"])} for n, c in cells.items()},
                  "reference_seconds": reference_seconds, "load_average": os.getloadavg(),
                  "seconds": round(time.time() - t_start, 1), "rows": limits.with_machine(rows, machine),
                  "speedups": ratios, "goals": measured_goals}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2, default=float))


if __name__ == "__main__":
    try:
        main()
    except ValueError as err:  # a bad option: one line, no traceback
        sys.exit(f"Error: {err}")
