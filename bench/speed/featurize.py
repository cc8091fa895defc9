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
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import featurize_data as fd  # noqa: E402
import featurize_report as report  # noqa: E402
from featurize_options import build_parser, check_names, complete_defaults, settings_for  # noqa: E402

WORKER = Path(__file__).resolve().parent / "featurize_worker.py"


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


@dataclass(frozen=True)
class BenchRun:
    """What every shape of one run shares, fixed before the first shape begins."""

    args: argparse.Namespace  # the options, their device defaults completed (featurize_options)
    device: str
    bf16_native: bool  # False: bf16 settings on a CPU are skipped unless --cpu-bf16 (settings_for)
    ceiling_precision: str  # the matmul ceiling the shares are of: bf16 on a GPU, fp32 on a CPU
    t_start: float
    deadline: float  # no setting begins after it (--budget-s; inf without)
    folder: Path  # scratch: the workers' specs, texts, logs, results and the bert shapes' model dirs


def skipped_shape_rows(shape: str, systems: list[str], cells: dict, run: BenchRun) -> list[dict]:
    """A shape reached past the deadline: no model built, no reference; every setting reported as skipped."""
    return [report.make_row({**s, "status": "skipped", "reason": s.get("skip", "time budget")}, shape, cells[n],
                            None, None, 1.0)
            for system in systems for n in cells
            for s in settings_for(system, n, run.args, run.device, run.bf16_native)]


def shape_references(shape: str, model_dir: str, cells: dict, device: str, reference_seconds: dict) -> dict:
    """Per text set: the fp32 reference features of its sample (their seconds go into reference_seconds); each
    cell's "flops" is set to its texts' FLOPs on this shape."""
    refs = {}
    for name, cell in cells.items():
        cell["flops"] = float(fd.flops_per_text(model_dir, cell["n_tokens"]).sum())
        t0 = time.perf_counter()
        refs[name] = fd.reference(model_dir, [cell["texts"][i] for i in cell["sample"]],
                                  cell["max_length"], device)
        reference_seconds[f"{shape}/{name}"] = round(time.perf_counter() - t0, 2)
    return refs


def run_system(shape: str, system: str, model_dir: str, cells: dict, refs: dict, run: BenchRun,
               ceiling: float) -> list[dict]:
    """One system on one shape: its settings marked "skip" reported as skipped, the others run in one worker
    process. ceiling: the matmul ceiling probed before the shapes (main sets the shares again at the end)."""
    settings = [s for name in cells for s in settings_for(system, name, run.args, run.device, run.bf16_native)]
    rows = [report.make_row({**{k: v for k, v in s.items() if k != "skip"}, "status": "skipped",
                             "reason": s["skip"]}, shape, cells[s["text_set"]], None, None, 1.0)
            for s in settings if "skip" in s]
    settings = [s for s in settings if "skip" not in s]
    if not settings:
        return rows
    spec = {"system": system, "model_dir": model_dir, "device": run.device, "repeats": run.args.repeats,
            "deadline": run.deadline if run.deadline != float("inf") else 1e18, "settings": settings,
            "text_sets": {n: {"texts": str(run.folder / f"texts-{n}.json"), "sample": c["sample"],
                              "max_length": c["max_length"], "warmup": run.args.warmup_texts}
                          for n, c in cells.items()}}
    log(run.t_start, f"{shape} {system}: {len(settings)} settings")
    python = run.args.st_python if system == "sentence-transformers" else sys.executable
    for r in run_worker(spec, run.folder, f"{shape}-{system}", dict(ENV_AT_START), run.args.grace_s, python):
        feats = r.pop("features")
        rows.append(report.make_row(r, shape, cells[r["text_set"]], refs[r["text_set"]], feats, ceiling))
    return rows


def run_shapes(shapes: list[str], systems: list[str], cells: dict, minilm_dir: str, run: BenchRun,
               probes: list[dict]) -> tuple[list[dict], dict]:
    """Every shape in turn (its model, its fp32 references, each system's worker): the rows, and the seconds
    of each reference by "shape/text set"."""
    rows, reference_seconds = [], {}
    for shape in shapes:
        if time.time() > run.deadline:
            rows += skipped_shape_rows(shape, systems, cells, run)
            continue
        model_dir = fd.make_shape(shape, minilm_dir, run.folder)
        refs = shape_references(shape, model_dir, cells, run.device, reference_seconds)
        log(run.t_start, f"{shape}: fp32 references done")
        for system in systems:
            rows += run_system(shape, system, model_dir, cells, refs, run,
                               max(p[run.ceiling_precision] for p in probes))
    return rows, reference_seconds


def print_header(run: BenchRun, name: str, machine: dict, ceiling: float, cells: dict) -> None:
    """What the tables were measured on: the device, the machine, the ceiling, the text sets."""
    import limits

    print(f"\n## featurize benchmark, {run.device}: {name}")
    print(limits.machine_line(machine))
    print(f"{run.ceiling_precision} matmul ceiling: {ceiling:,.0f} GFLOP/s (best of the probes before and after); "
          f"load average {os.getloadavg()[0]:.1f}; {time.time() - run.t_start:.0f} s in all")
    for n, c in cells.items():
        print(f"{n}: {len(c['texts']):,} texts, {c['real_tokens']:,} real tokens at max {c['max_length']}, "
              f"tokenizer alone {c['tokenizer_alone_tokens_per_s']:,} tok/s")


def report_run(run: BenchRun, cells: dict, rows: list[dict], probes: list[dict], ceiling: float,
               reference_seconds: dict) -> None:
    """Print the header, the table, the speed-ups and the goals; write them all as JSON where --json asks."""
    import limits

    machine = limits.machine(run.device)
    name = device_name(run.device)
    ratios = report.speedups(rows)
    print_header(run, name, machine, ceiling, cells)
    report.print_table(rows)
    report.print_speedups(ratios)
    measured_goals = report.goals(rows, ratios, run.device)
    report.print_goals(measured_goals)
    if run.args.json:
        result = {"device": run.device, "device_name": name, "machine": machine, "args": vars(run.args),
                  "ceiling_precision": run.ceiling_precision, "ceiling_gflop_per_s": ceiling,
                  "matmul_probes": probes,
                  "text_sets": {n: {k: v for k, v in c.items() if k not in ("texts", "n_tokens", "sample")}
                                | {"n_texts": len(c["texts"])} for n, c in cells.items()},
                  "reference_seconds": reference_seconds, "load_average": os.getloadavg(),
                  "seconds": round(time.time() - run.t_start, 1), "rows": limits.with_machine(rows, machine),
                  "speedups": ratios, "goals": measured_goals}
        Path(run.args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(run.args.json).write_text(json.dumps(result, indent=2, default=float))


def main():
    args = build_parser(__doc__).parse_args()

    import limits
    import torch

    from headstore.featurize.encoder.hardware import native_bf16
    from headstore.featurize.encoder.model import model_identity, resolve_model

    t_start = time.time()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    complete_defaults(args, device)
    deadline = t_start + args.budget_s if args.budget_s else float("inf")
    shapes, systems = args.shapes.split(","), args.systems.split(",")
    check_names(shapes, systems)
    bf16_native = native_bf16()
    ceiling_precision = "bf16" if device == "cuda" else "fp32"

    minilm_dir = resolve_model(args.model)
    max_len = model_identity(args.model).max_length
    cells = prepare_text_sets(args, minilm_dir, max_len)
    log(t_start, "text sets read: " + ", ".join(f"{n} {len(c['texts']):,}" for n, c in cells.items()))
    probes = [limits.probe([ceiling_precision], device)]
    if device == "cuda":
        torch.cuda.empty_cache()  # the probe's matrices: the workers' peak memory is theirs alone anyway
    log(t_start, f"matmul probe: {probes[0]}")
    run = BenchRun(args, device, bf16_native, ceiling_precision, t_start, deadline,
                   Path(tempfile.mkdtemp(prefix="bench-featurize-")))
    for name, cell in cells.items():
        (run.folder / f"texts-{name}.json").write_text(json.dumps(cell["texts"]))
    try:
        rows, reference_seconds = run_shapes(shapes, systems, cells, minilm_dir, run, probes)
        probes.append(limits.probe([ceiling_precision], device))
        ceiling = limits.best_of(*probes)[ceiling_precision]
        for r in rows:  # shares against the best probe of the run (the first probe may have been unlucky)
            if r["status"] == "ok":
                r["share_of_ceiling"] = round(r["gflop_per_s"] / ceiling, 4)
    finally:
        shutil.rmtree(run.folder, ignore_errors=True)
    report_run(run, cells, rows, probes, ceiling, reference_seconds)

if __name__ == "__main__":
    try:
        main()
    except ValueError as err:  # a bad option: one line, no traceback
        sys.exit(f"Error: {err}")
