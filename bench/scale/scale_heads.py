"""Benchmark: heads at corpus scale -- train-head, eval, index and a grid as the corpus grows.

    nice -n 5 python bench/scale/scale_heads.py --sizes 10000,100000,1000000 --work runs/scale-heads \\
        --json runs/scale_heads.json [--grid-size 1000000]

A synthetic BEIR set per size: documents are unique random sentences (a 70-word vocabulary, 5-12 words,
each made unique by its number); 2,000 train / 200 dev / 500 test queries, each a noisy copy of one of the
first 10,000 documents (without its number, half its words replaced), so every size holds every query's document and the
sizes differ only by the documents added. Featurized once per size by a tiny random BERT of width 384
(MiniLM's width; 1 layer, intermediate 128, 16 tokens) into a store cached under --work (featurize is
fingerprinted: a store is reused only when what made it is unchanged). Each command runs in its own process;
measured from outside: wall seconds and the peak RSS of the process tree (polled from /proc, as
bench/scale/scale.py does). Per size:

- `train-head` with the defaults (above exact_max=20,000 documents: candidates) -- seconds per epoch
  (train_seconds / epochs run), whole wall, peak RSS, test nDCG@10, how negatives and dev were made;
- where the exact search can run (--exact-sizes): the candidates run forced (--exact-max 0) and the exact
  run (--exact-max 10**9), both --no-guard (so trained heads are compared, not the starting point the guard
  may return for both), for each of --seeds, and their mean test nDCG@10 difference;
- at --remine-sizes: the default trained with each --remine-every schedule beside every epoch, per seed;
- `eval` and `index` of the default head;
- with --grid-size: a 64-head `cli grid` (4 lr x 4 weight decay x 4 seeds: one stack; --grid-remine-every),
  with the epochs it ran and its dev-best configuration's dev and test (the heads `--test-scope auto` tested).

The RSS goal is 1 GB + 1.2 x the task's float32 features (every document and query row, D=384). The
machine is shared: the load average is recorded before each command.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale import tree_rss  # noqa: E402  (bench/scale/scale.py: peak RSS of a process tree, from /proc)

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega red green blue black white grey brown pink gold silver cold warm hot wet dry "
         "soft hard fast slow big small tall short old new young early late north south east west river lake "
         "hill stone tree leaf wind rain snow sun moon star cloud").split()  # 70 words
N_TRAIN, N_DEV, N_TEST = 2000, 200, 500
DIM = 384
DEVICE = "cpu"  # featurize's and the heads' device (--device)
INDEX = True  # time `cli index` (--no-index: where FAISS is not installed)
FLOPS = False  # count the grid's matmul FLOPs (--flops)
SEEDS = [0]  # seeds of the candidates-vs-exact runs (--seeds)
REMINE_EVERY: list[int] = []  # schedules compared at --remine-sizes (--remine-every)
REMINE_SEEDS = [0, 1, 2]  # their seeds (--remine-seeds)
GRID_REMINE_EVERY = 1  # the grid's schedule (--grid-remine-every)


def build_model(folder: Path) -> str:
    """A random BERT of width 384 (1 layer, intermediate 128, 16 tokens): features of MiniLM's width, cheap."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    if (folder / "model.safetensors").exists():
        return str(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *"0123456789", *[f"##{d}" for d in "0123456789"]]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab=str(folder / "vocab.txt"), model_max_length=16).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=DIM, num_hidden_layers=1, num_attention_heads=6,
                        intermediate_size=128, max_position_embeddings=32)
    BertModel(config).eval().save_pretrained(folder, safe_serialization=True)
    return str(folder)


def doc_text(i: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))) + f" {i}"


def build_beir(folder: Path, n_docs: int) -> Path:
    """The synthetic BEIR folder of one size (written once; the first 10,000 documents and the queries are the
    same at every size)."""
    if (folder / "qrels" / "test.tsv").exists():
        return folder
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    docs = [doc_text(i, rng) for i in range(10_000)]
    with open(folder / "corpus.jsonl", "w") as f:
        for i in range(n_docs):
            text = docs[i] if i < 10_000 else doc_text(i, rng)
            f.write(json.dumps({"_id": f"d{i}", "title": "", "text": text}) + "\n")
    qrng = random.Random(1)
    targets = qrng.sample(range(10_000), N_TRAIN + N_DEV + N_TEST)
    with open(folder / "queries.jsonl", "w") as f:
        for j, d in enumerate(targets):
            words = docs[d].split()[:-1]  # without its number
            for w in qrng.sample(range(len(words)), len(words) // 2):
                words[w] = qrng.choice(WORDS)  # half the words replaced
            f.write(json.dumps({"_id": f"q{j}", "text": "find " + " ".join(words)}) + "\n")
    bounds = {"train": (0, N_TRAIN), "dev": (N_TRAIN, N_TRAIN + N_DEV), "test": (N_TRAIN + N_DEV, len(targets))}
    for split, (a, b) in bounds.items():
        lines = ["query-id\tcorpus-id\tscore"] + [f"q{j}\td{targets[j]}\t1" for j in range(a, b)]
        (folder / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return folder


def cli(args: list[str], log: Path) -> dict:
    """Run a CLI command in its own process: wall seconds, peak RSS of its process tree, the load before."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(log, "w") as out:
        child = subprocess.Popen([sys.executable, "-m", "headstore.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                                 env={**os.environ, "HEADSTORE_PROGRESS": "off"})
        peak = 0
        while child.poll() is None:
            peak = max(peak, tree_rss(child.pid))
            time.sleep(0.1)
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({child.returncode}); see {log}")
    return {"wall_s": round(time.perf_counter() - t0, 1), "peak_rss_mb": round(peak / 2**20), "load": round(load, 2)}


def train(work: Path, store: Path, data: Path, name: str, extra: list[str]) -> dict:
    """One train-head run: wall, RSS, seconds per epoch, test nDCG@10, how negatives and dev were made."""
    out = work / name
    r = cli(["train-head", "--store", str(store), "--data", str(data), "--out", str(out), "--overwrite", "--device",
             DEVICE, *extra], work / f"{name}.log")
    m = json.loads((out / "metrics.json").read_text())
    c = json.loads((out / "config.json").read_text())
    epochs = len(m["history"])
    return {**r, "epochs": epochs, "s_per_epoch": round(c["train_seconds"] / epochs, 2),
            "test_ndcg10": m["head"][m["primary"]], "frozen_ndcg10": m["baseline"][m["baseline_primary"]],
            "negatives": m.get("negatives", {}).get("method"), "dev": m.get("dev_candidates", {}).get("method"),
            "top10_share": m.get("dev_candidates", {}).get("top10_share")}


GRID = ("[grid]\nlr = [1e-3, 2e-3, 3e-3, 5e-3]\nweight_decay = [0.0, 0.01, 0.03, 0.1]\nseed = [0, 1, 2, 3]\n")


def one_size(work: Path, model: str, n: int, exact: bool, grid: bool, schedules: bool) -> dict:
    data = build_beir(work / f"beir-{n}", n)
    store = work / f"store-{n}"
    row: dict = {"docs": n, "features_mb": round((n + N_TRAIN + N_DEV + N_TEST) * DIM * 4 / 2**20)}
    f = cli(["featurize", "--model", model, "--data", str(data), "--store", str(store), "--device", DEVICE],
            work / f"featurize-{n}.log")
    row["featurize_s"] = f["wall_s"]
    row["default"] = train(work, store, data, f"head-{n}", [])
    head = work / f"head-{n}"
    row["eval"] = cli(["eval", "--store", str(store), "--head", str(head), "--data", str(data), "--out",
                       str(work / f"eval-{n}"), "--overwrite", "--device", DEVICE], work / f"eval-{n}.log")
    import shutil

    shutil.rmtree(work / f"index-{n}", ignore_errors=True)
    if INDEX:
        row["index"] = cli(["index", "--store", str(store), "--head", str(head), "--data", str(data), "--out",
                            str(work / f"index-{n}")], work / f"index-{n}.log")
    if exact:
        # --no-guard: the trained heads are compared (the guard may return the starting point for both)
        runs = {how: [train(work, store, data, f"head-{n}-{how}-s{seed}", [*flags, "--no-guard", "--seed", str(seed)])
                      for seed in SEEDS]
                for how, flags in (("cand", ["--exact-max", "0"]), ("exact", ["--exact-max", str(10**9)]))}
        row["candidates"], row["exact"] = runs["cand"][0], runs["exact"][0]
        diffs = [c["test_ndcg10"] - e["test_ndcg10"] for c, e in zip(runs["cand"], runs["exact"])]
        row["ndcg_cand_minus_exact"] = round(float(sum(diffs) / len(diffs)), 4)
        row["cand_minus_exact_per_seed"] = [round(d, 4) for d in diffs]
    for every in ([1, *REMINE_EVERY] if schedules else []):  # re-mining schedules, per seed
        row[f"remine_every_{every}"] = [train(work, store, data, f"head-{n}-every{every}-s{seed}",
                                              ["--remine-every", str(every), "--seed", str(seed)])
                                        for seed in REMINE_SEEDS]
    if grid:
        (work / "grid64.toml").write_text(grid_spec())
        row["grid64"] = cli(["grid", "--store", str(store), "--data", str(data), "--grid", str(work / "grid64.toml"),
                             "--out", str(work / f"grid-{n}"), "--overwrite", "--device", DEVICE], work / f"grid-{n}.log")
        row["grid64"].update(grid_facts(work / f"grid-{n}"), remine_every=GRID_REMINE_EVERY)
        if FLOPS:
            row["grid64"].update(grid_flops(work, store, data, row["grid64"]))
    row["rss_goal_mb"] = round(1024 + 1.2 * row["features_mb"])
    print(json.dumps(row), flush=True)
    return row


def grid_spec(epochs: int | None = None) -> str:
    fixed = ([f"remine_every = {GRID_REMINE_EVERY}"] if GRID_REMINE_EVERY != 1 else []) + \
        ([f"epochs = {epochs}"] if epochs else [])
    return GRID + ("[fixed]\n" + "\n".join(fixed) + "\n" if fixed else "")


def counted_flops(args: list[str]) -> int:
    """Matmul FLOPs of one CLI command run in this process, as torch's FlopCounterMode counts them (matrix
    products: mm, bmm, addmm, ...; the L1 energies are no matmul and are not counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    from headstore.cli import main as cli_main

    os.environ["HEADSTORE_PROGRESS"] = "off"
    with FlopCounterMode(display=False) as counter:
        cli_main(args, standalone_mode=False)
    return int(counter.get_total_flops())


def bf16_peak(device: str) -> float:
    """FLOP/s of an n^3 bf16 matrix product on `device` (the mean of ten after three warm-ups; n = 8192 on a
    GPU, 1024 on a CPU): the ceiling the grid is compared with."""
    import torch

    n = 8192 if device.startswith("cuda") else 1024
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    sync()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    sync()
    return 10 * 2 * n ** 3 / (time.perf_counter() - t0)


def grid_flops(work: Path, store: Path, data: Path, grid: dict) -> dict:
    """The grid's matmul FLOPs and its share of the device's bf16 matmul ceiling: the same grid counted at 1
    and 2 epochs (FlopCounterMode), so FLOPs = F1 + (epochs - 1) (F2 - F1) for the epochs the stack ran (F1: the
    fixed work and the first epoch, whose negatives are mined in the frozen space; F2 - F1: an epoch that
    re-mines in head space), over the grid's wall time (its whole command: reading, ranking, writing included)."""
    counts = {}
    for epochs in (1, 2):
        spec = work / f"grid64-e{epochs}.toml"
        spec.write_text(grid_spec(epochs))
        counts[epochs] = counted_flops(["grid", "--store", str(store), "--data", str(data), "--grid", str(spec),
                                        "--out", str(work / f"grid-flops-e{epochs}"), "--overwrite", "--device",
                                        DEVICE])
    total = counts[1] + (grid["epochs"] - 1) * (counts[2] - counts[1])
    peak = bf16_peak(DEVICE)
    achieved = total / grid["wall_s"]
    return {"matmul_flops": total, "flops_epoch": counts[2] - counts[1], "flops_first_epoch": counts[1],
            "achieved_tflops": round(achieved / 1e12, 3), "bf16_peak_tflops": round(peak / 1e12, 1),
            "share_of_bf16_peak": achieved / peak}


def grid_facts(out: Path) -> dict:
    """Epochs the stack ran, the heads ranked on test and the best configuration's dev and test (results.parquet)."""
    import polars as pl

    frame = pl.read_parquet(out / "results.parquet")
    epochs = max(len(json.loads(h)) for h in frame["history"])
    tested = frame.filter(pl.col("test_scored"))
    return {"heads": frame.height, "epochs": epochs, "tested": tested.height,
            "best_dev": round(float(tested["dev_primary"].mean()), 4), "best_test": round(float(tested["test_primary"].mean()), 4),
            "best_lr_wd": [tested["lr"][0], tested["weight_decay"][0]] if tested.height else None}


def table(rows: list[dict]) -> str:
    head = ["docs", "s/epoch", "train-head s", "epochs", "peak RSS MB", "RSS goal MB", "test nDCG@10",
            "negatives/dev", "top-10 share", "exact nDCG@10", "cand - exact", "eval s", "index s", "grid64 s", "load"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        d = r["default"]
        vals = [f"{r['docs']:,}", d["s_per_epoch"], d["wall_s"], d["epochs"], d["peak_rss_mb"], r["rss_goal_mb"],
                f"{d['test_ndcg10']:.4f}", f"{d['negatives']}/{d['dev']}", d["top10_share"],
                f"{r['exact']['test_ndcg10']:.4f}" if "exact" in r else "-",
                f"{r['ndcg_cand_minus_exact']:+.4f}" if "exact" in r else "-", r["eval"]["wall_s"],
                r["index"]["wall_s"] if "index" in r else "-", r["grid64"]["wall_s"] if "grid64" in r else "-",
                d["load"]]
        lines.append("| " + " | ".join(str(v) for v in vals) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000,3000000")
    parser.add_argument("--exact-sizes", default="10000,100000", help="sizes where the exact run is compared")
    parser.add_argument("--grid-size", type=int, default=1_000_000, help="size of the 64-head grid (0: none)")
    parser.add_argument("--work", default="runs/scale-heads", help="data, stores and runs (reused when present)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", default="cpu", help="featurize, train, evaluate and run the grid on this device")
    parser.add_argument("--no-index", action="store_true", help="leave `cli index` out (no FAISS installed)")
    parser.add_argument("--flops", action="store_true", help="count the grid's matmul FLOPs and its share of the "
                        "device's bf16 matmul ceiling (a GPU)")
    parser.add_argument("--seeds", default="0", help="seeds of the candidates-vs-exact runs")
    parser.add_argument("--remine-every", default="", help="at --remine-sizes, also train with these schedules "
                        "(e.g. 2,3) beside the default's every epoch, for each seed")
    parser.add_argument("--remine-sizes", default="", help="sizes where the --remine-every schedules are compared")
    parser.add_argument("--remine-seeds", default="0,1,2", help="seeds of the --remine-every runs")
    parser.add_argument("--grid-remine-every", type=int, default=1, help="the 64-head grid's remine_every")
    args = parser.parse_args()
    global DEVICE, SEEDS, REMINE_EVERY, GRID_REMINE_EVERY, REMINE_SEEDS, INDEX, FLOPS
    DEVICE, GRID_REMINE_EVERY, INDEX, FLOPS = args.device, args.grid_remine_every, not args.no_index, args.flops
    SEEDS = [int(x) for x in args.seeds.split(",") if x]
    REMINE_EVERY = [int(x) for x in args.remine_every.split(",") if x]
    REMINE_SEEDS = [int(x) for x in args.remine_seeds.split(",") if x]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = build_model(work / "tiny-bert-384")
    exact = {int(x) for x in args.exact_sizes.split(",") if x}
    schedule_sizes = {int(x) for x in args.remine_sizes.split(",") if x}
    rows, result = [], {"argv": sys.argv, "cpus": os.cpu_count(), "load_start": os.getloadavg()}
    for n in [int(x) for x in args.sizes.split(",")]:
        rows.append(one_size(work, model, n, n in exact, n == args.grid_size, n in schedule_sizes))
        result["rows"] = rows
        if args.json:
            Path(args.json).write_text(json.dumps({**result, "load_end": os.getloadavg()}, indent=1))
    print(table(rows))
    for r in rows:
        for key in sorted(k for k in r if k.startswith("remine_every_")):
            runs = r[key]
            print(f"{r['docs']:,} docs, {key}: test nDCG@10 mean {sum(x['test_ndcg10'] for x in runs) / len(runs):.4f} "
                  f"over seeds {REMINE_SEEDS}; s/epoch {sum(x['s_per_epoch'] for x in runs) / len(runs):.2f}")
        if "grid64" in r:
            print(f"{r['docs']:,} docs, 64-head grid: {json.dumps(r['grid64'])}")


if __name__ == "__main__":
    main()
