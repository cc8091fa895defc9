"""Benchmark: featurize at scale -- time per text, peak memory, store size, commit share.

    python bench/scale/scale.py --sizes 10000,100000,1000000,10000000 --engines local,ray \\
        --minilm --out runs/scale --json runs/scale.json

A synthetic corpus (random sentences over a 70-word vocabulary, each made unique by its number,
5-30 words) is written as a .txt file per size and featurized into a fresh store by `cli featurize`
in its own process, through a tiny random BERT (hidden 32, 2 layers, 24 tokens) so that the
encoder is not what grows. Measured from outside the process: wall time, and peak RSS of the whole
process tree (the CLI and, for --engine ray, the Ray processes it starts: GCS, raylet, actors),
polled every 0.1 s from /proc. From the run's own summary: the seconds spent committing. Also the
store's size on disk. The issue's goals: peak RSS <= 1 GB + 100 bytes per text (local engine, tiny
model) and time per text flat within 1.3x from 100k texts up.

--minilm also featurizes SciFact + STS-B with the offline MiniLM, local engine vs ray engine (2 CPU
actors), --dtype float32, and reports the largest feature difference between the two stores.
The machine is shared: the load average is recorded; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "featurize"))  # the tests' tiny BERT builder

from featurize_helpers import WORDS, build_tiny_bert  # noqa: E402


def write_corpus(path: Path, n: int, seed: int = 0) -> None:
    """n unique sentences, one per line (written in blocks: the bench itself stays small)."""
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    with open(path, "w") as f:
        for start in range(0, n, 100_000):
            m = min(100_000, n - start)
            lengths = rng.integers(5, 31, size=m)
            picks = words[rng.integers(0, len(words), size=int(lengths.sum()))]
            ends = np.cumsum(lengths)
            lines = [" ".join(picks[e - k:e]) + f" {start + i}"
                     for i, (k, e) in enumerate(zip(lengths, ends))]
            f.write("\n".join(lines) + "\n")


def tree_rss(root_pid: int) -> int:
    """Resident bytes of a process and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            pid, ppid = int(entry), int(fields[1])
            rss[pid] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
            children.setdefault(ppid, []).append(pid)
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def run_measured(args: list[str], log: Path) -> dict:
    """Run a CLI command; wall seconds, peak tree RSS, and the JSON summary it printed."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "true"}
    t0 = time.perf_counter()
    with open(log, "w") as err:
        child = subprocess.Popen([sys.executable, "-m", "headstore.cli", *args], stdout=subprocess.PIPE,
                                 stderr=err, text=True, env=env)
        peak = 0
        while child.poll() is None:
            peak = max(peak, tree_rss(child.pid))
            time.sleep(0.1)
        out = child.stdout.read()
    wall = time.perf_counter() - t0
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({child.returncode}); see {log}")
    return {"wall_s": wall, "peak_rss": peak, "summary": json.loads(out[out.index("{"):])}


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def synthetic(out: Path, sizes: list[int], engines: list[str], workers: int) -> list[dict]:
    model = build_tiny_bert(out / "tiny-bert")
    rows = []
    for n in sizes:
        corpus = out / f"corpus-{n}.txt"
        if not corpus.exists():
            write_corpus(corpus, n)
        for engine in engines:
            store = out / f"store-{engine}-{n}"
            shutil.rmtree(store, ignore_errors=True)
            args = ["featurize", "--model", model, "--data", str(corpus), "--format", "text",
                    "--store", str(store), "--device", "cpu"]
            if engine == "ray":
                args += ["--engine", "ray", "--workers", str(workers)]
            load = os.getloadavg()[0]
            result = run_measured(args, out / f"log-{engine}-{n}.txt")
            s = result["summary"]
            assert s["n_texts"] == n, s
            rows.append({"model": "tiny", "engine": engine, "n_texts": n, "wall_s": round(result["wall_s"], 2),
                         "us_per_text": round(1e6 * result["wall_s"] / n, 1),
                         # the run itself (reading, dedup, encoding, commits), without start-up
                         # (imports, Ray start): what must stay flat as the corpus grows
                         "run_us_per_text": round(1e6 * s["seconds"] / n, 1),
                         "peak_rss_mb": round(result["peak_rss"] / 2**20, 1),
                         "rss_goal_mb": round((2**30 + 100 * n) / 2**20, 1),
                         "store_mb": round(dir_size(store) / 2**20, 1),
                         "commit_share": round(s["commit_seconds_total"] / max(s["seconds"], 1e-9), 4),
                         "n_commits": s["n_commits"], "load_before": round(load, 2)})
            print(json.dumps(rows[-1]), flush=True)
            shutil.rmtree(store, ignore_errors=True)
    return rows


def minilm(out: Path, data: Path, workers: int) -> list[dict]:
    from headstore.data.text_id import text_ids
    from headstore.featurize.run.source import all_chunks, open_sources
    from headstore.featurize.store.reader import FeatureStore

    rows, stores = [], {}
    for engine in ("local", "ray"):
        store = out / f"store-minilm-{engine}"
        shutil.rmtree(store, ignore_errors=True)
        args = ["featurize", "--model", "minilm", "--data", str(data / "scifact"), "--data",
                str(data / "stsb"), "--store", str(store), "--dtype", "float32", "--device", "cpu"]
        if engine == "ray":
            args += ["--engine", "ray", "--workers", str(workers)]
        load = os.getloadavg()[0]
        result = run_measured(args, out / f"log-minilm-{engine}.txt")
        s = result["summary"]
        stores[engine] = store
        rows.append({"model": "minilm", "engine": engine, "n_texts": s["n_texts"],
                     "wall_s": round(result["wall_s"], 2),
                     "us_per_text": round(1e6 * result["wall_s"] / s["n_texts"], 1),
                     "peak_rss_mb": round(result["peak_rss"] / 2**20, 1),
                     "store_mb": round(dir_size(store) / 2**20, 1),
                     "commit_share": round(s["commit_seconds_total"] / max(s["seconds"], 1e-9), 4),
                     "n_commits": s["n_commits"], "load_before": round(load, 2)})
        print(json.dumps(rows[-1]), flush=True)
    texts = [t for chunk in all_chunks(open_sources([data / "scifact", data / "stsb"], None)) for t in chunk[1]]
    ids = list(dict.fromkeys(text_ids(texts)))
    a, b = FeatureStore.open(stores["local"]), FeatureStore.open(stores["ray"])
    diff = float(np.abs(a.features(a.rows_for(ids)) - b.features(b.rows_for(ids))).max())
    for row in rows:
        row["max_abs_diff_local_vs_ray"] = diff
    return rows


def table(rows: list[dict]) -> str:
    head = ["model", "engine", "n_texts", "wall_s", "us_per_text", "run_us_per_text", "peak_rss_mb", "rss_goal_mb",
            "store_mb", "commit_share", "n_commits", "load_before"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(k, "")) for k in head) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--engines", default="local,ray")
    parser.add_argument("--ray-max", type=int, default=10**9, help="largest size run with ray")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--minilm", action="store_true")
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "datasets"))
    parser.add_argument("--out", default="runs/scale")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = [int(x) for x in args.sizes.split(",")]
    engines = args.engines.split(",")
    load_start = os.getloadavg()
    rows = []
    for engine in engines:
        rows += synthetic(out, [n for n in sizes if engine == "local" or n <= args.ray_max],
                          [engine], args.workers)
    if args.minilm:
        rows += minilm(out, Path(args.data), args.workers)
    result = {"rows": rows, "load_start": load_start, "load_end": os.getloadavg(),
              "cpus": os.cpu_count(), "argv": sys.argv}
    for engine in engines:
        per = {r["n_texts"]: r["run_us_per_text"] for r in rows if r["model"] == "tiny" and r["engine"] == engine}
        big = [n for n in per if n >= 100_000]
        if len(big) >= 2:
            result[f"{engine}_time_per_text_ratio_max_over_100k"] = round(max(per[n] for n in big) / per[100_000], 3) \
                if 100_000 in per else None
    print(table(rows))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
