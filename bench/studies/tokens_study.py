"""Token heads on STS-B (issue 57 item 3), a prototype outside the product: learned queries attending over the cached
per-token states of a few MiniLM layers (bench/studies/tokens_cache.py), beside the taps head, in one plain torch
loop that reproduces train-head's STS-B recipe (l1 energy, Pearson loss on the graded scores, batch 64, 10 epochs,
the best dev epoch kept, the residual head f(x) = features + W [features; extra] + b with W zero at the start).

Per chosen layer l, q learned queries attend over the text's layer-l tokens (padding masked): weights
softmax(Q (LN(H) Wk)^T / sqrt(r)), output the weighted mean of the raw tokens H. Wk starts at zero, so every query
starts as the mean pool (the layer's `tap_block_l`): the head starts where the taps head on those layers starts and
may learn where to look. Each pooled vector is standardised with the train texts' mean pool statistics and scaled
to unit size (1/sqrt(d)), as the taps prototype scaled its taps. Regularisers: array dropout (each extra vector
dropped whole per text), token dropout (tokens left out of the attention in training), Gaussian noise on the input,
and self-distillation (the energy of a teacher run on the same store matched on the batch's pairs and on shuffled
pairs). Dev selects; test is read once per run, for the table.

    python3 bench/studies/tokens_study.py --store STORE --data ../shared/datasets/stsb --cache CACHE \\
        --out /work/scratch/tokens/runs --candidates KEY,KEY --seeds 0

Each run's JSON lands in --out/KEY-sSEED.json (a rerun skips finished runs); --json collects them.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from headstore.featurize.store.reader import FeatureStore  # noqa: E402
from headstore.heads.kinds import load_task  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tokens_vqt import VqtPool  # noqa: E402

B6A6 = ["block_6", "attn_6"]
TOP4 = ["tap_attn_6", "tap_mlp_6", "tap_mlp_2", "tap_mlp_3"]  # select-taps' top four on STS-B (docs/taps.md)


@dataclass
class Spec:
    taps: list[str] = field(default_factory=list)  # pooled store arrays beside features
    layers: list[str] = field(default_factory=list)  # cached token arrays (block_6, attn_6, ...) to attend over
    vqt: list[int] = field(default_factory=list)  # layers whose frozen block the queries pass (tokens_vqt.py)
    queries: int = 4
    rank: int = 64
    lr: float = 1e-3
    array_drop: float = 0.0
    token_drop: float = 0.0
    noise: float = 0.0
    attn_lr: float | None = None  # the queries' and keys' learning rate (None: lr; 0: frozen, the mean pools)
    cap: int = 64  # tokens per text read (STS-B's longest text is below it)
    distill: str = ""  # a teacher run's key: its energies matched (weight distill_weight)
    distill_weight: float = 1.0


CANDIDATES = {
    "features": Spec(),
    "taps4-adrop": Spec(taps=TOP4, array_drop=0.3),
    "taps4-adrop-lr3e-4": Spec(taps=TOP4, array_drop=0.3, lr=3e-4),
    "tok-b456": Spec(layers=["block_4", "block_5", "block_6"]),
    "tok-b456-adrop": Spec(layers=["block_4", "block_5", "block_6"], array_drop=0.3),
    "tok-b6a6-adrop": Spec(layers=["block_6", "attn_6"], array_drop=0.3),
    "tok-b3456a6-adrop": Spec(layers=["block_3", "block_4", "block_5", "block_6", "attn_6"], array_drop=0.3),
    "taps4+tok-b6a6-adrop": Spec(taps=TOP4, layers=["block_6", "attn_6"], array_drop=0.3),
    "vqt-6-adrop-lr3e-4": Spec(vqt=[6], array_drop=0.3, lr=3e-4),
    "vqt-456-adrop-lr3e-4": Spec(vqt=[4, 5, 6], array_drop=0.3, lr=3e-4, queries=2),
    "taps4+vqt-6-adrop-lr3e-4": Spec(taps=TOP4, vqt=[6], array_drop=0.3, lr=3e-4),
    "taps4-adrop-lr3e-4-sd": Spec(taps=TOP4, array_drop=0.3, lr=3e-4, distill="taps4-adrop-lr3e-4"),
    "taps4-adrop-lr3e-4-noise": Spec(taps=TOP4, array_drop=0.3, lr=3e-4, noise=0.01),
    "tok-b6a6-adrop-lr3e-4": Spec(layers=B6A6, array_drop=0.3, lr=3e-4),
    "tok-b6a6-adrop-lr3e-4-frozen": Spec(layers=B6A6, array_drop=0.3, lr=3e-4, attn_lr=0.0),
    "tok-b6a6-adrop-lr3e-4-alr1e-4": Spec(layers=B6A6, array_drop=0.3, lr=3e-4, attn_lr=1e-4),
    "tok-b6a6-adrop-lr3e-4-alr1e-4-q1": Spec(layers=B6A6, array_drop=0.3, lr=3e-4, attn_lr=1e-4, queries=1),
    "tok-b6a6-adrop-lr3e-4-tdrop": Spec(layers=B6A6, array_drop=0.3, lr=3e-4, token_drop=0.2),
    "taps4+tok-b6a6-adrop-lr3e-4": Spec(taps=TOP4, layers=["block_6", "attn_6"], array_drop=0.3, lr=3e-4),
}


class Data:
    """The STS-B pairs as positions into the rows read, the pooled arrays and the cached tokens of those rows."""

    def __init__(self, store_path: str, data: str, cache: Path, spec: Spec):
        store = FeatureStore.open(store_path)
        task = load_task(data, store)
        sets = {"train": task.train, **task.eval_sets}
        self.rows = np.unique(np.concatenate([np.concatenate([s.anchor, s.positive]) for s in sets.values()]))
        where = {r: i for i, r in enumerate(self.rows)}
        self.pairs = {k: (torch.tensor([where[r] for r in s.anchor]), torch.tensor([where[r] for r in s.positive]),
                          torch.from_numpy(np.asarray(s.labels, dtype=np.float32))) for k, s in sets.items()}
        train = torch.unique(torch.cat(self.pairs["train"][:2]))
        self.features = F.normalize(torch.from_numpy(store.features(self.rows).astype(np.float32)), dim=-1)
        self.taps = [_unit(torch.from_numpy(store.features(self.rows, t).astype(np.float32)), train) for t in spec.taps]
        offsets = np.load(cache / "offsets.npy")
        self.start = torch.from_numpy(offsets[self.rows])
        self.length = torch.from_numpy(np.minimum(offsets[self.rows + 1] - offsets[self.rows], spec.cap))
        self.tokens = [torch.from_numpy(np.load(cache / f"{name}.npy"))
                       for name in spec.layers + [f"block_{i - 1}" for i in spec.vqt]]
        self.model = json.loads((Path(store_path) / "config.json").read_text())
        self.train_texts = train
        self.token_stats = []
        for tokens in self.tokens:  # the train texts' mean pools: the statistics each attention output is scaled by
            pooled = torch.stack([tokens[s:s + n].float().mean(0) for s, n in zip(self.start[train], self.length[train])])
            self.token_stats.append((pooled.mean(0), pooled.std(0).clamp_min(1e-6)))

    def batch_tokens(self, idx: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Each layer's (B, T, d) float32 tokens of texts `idx` and the (B, T) mask of real tokens."""
        length = self.length[idx]
        width = int(length.max())
        steps = torch.arange(width)
        mask = steps[None, :] < length[:, None]
        where = torch.where(mask, self.start[idx, None] + steps[None, :], 0)
        return [tokens[where].float() for tokens in self.tokens], mask


def _unit(x: torch.Tensor, train: torch.Tensor) -> torch.Tensor:
    """Standardised on the train texts, then scaled to unit size (1/sqrt(d)): each array weighs as one vector."""
    return (x - x[train].mean(0)) / x[train].std(0).clamp_min(1e-6) * x.shape[1] ** -0.5


class TokenHead(torch.nn.Module):
    """f(text) = features + W [features; taps; attention pools] + b, W zero at the start."""

    def __init__(self, data: Data, spec: Spec):
        super().__init__()
        d = data.features.shape[1]
        self.spec, self.stats = spec, data.token_stats
        self.queries = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(spec.queries, spec.rank) / spec.rank ** 0.5)
                                               for _ in spec.layers])
        self.keys = torch.nn.ModuleList([torch.nn.Linear(d, spec.rank, bias=False) for _ in spec.layers])
        for key in self.keys:
            torch.nn.init.zeros_(key.weight)  # uniform attention at the start: every query is the mean pool
        width = d + sum(t.shape[1] for t in data.taps) + sum(spec.queries * t.shape[1] for t in data.tokens)
        self.out = torch.nn.Linear(width, d)
        torch.nn.init.zeros_(self.out.weight)
        torch.nn.init.zeros_(self.out.bias)
        self.vqt = None
        if spec.vqt:
            sample, mask = data.batch_tokens(data.train_texts[:512])
            self.vqt = VqtPool(data.model["model"], data.model["max_length"], spec.vqt, spec.queries,
                               sample[len(spec.layers):], mask)

    def pools(self, tokens: list[torch.Tensor], mask: torch.Tensor) -> list[torch.Tensor]:
        """Per layer, per query, the attention-weighted mean of the tokens, standardised: (B, d) each."""
        if self.training and self.spec.token_drop > 0:  # leave tokens out of the attention, never all of a text's
            keep = (torch.rand(mask.shape) > self.spec.token_drop) & mask
            mask = torch.where(keep.any(1, keepdim=True), keep, mask)
        out = []
        for h, query, key, (mu, sd) in zip(tokens, self.queries, self.keys, self.stats):
            logits = torch.einsum("qr,btr->bqt", query, key(F.layer_norm(h, h.shape[-1:]))) / self.spec.rank ** 0.5
            weights = logits.masked_fill(~mask[:, None, :], float("-inf")).softmax(-1)
            pooled = torch.einsum("bqt,btd->bqd", weights, h)
            out.extend(((pooled - mu) / sd * h.shape[-1] ** -0.5).unbind(1))
        return out

    def forward(self, data: Data, idx: torch.Tensor) -> torch.Tensor:
        x = data.features[idx]
        extra = [t[idx] for t in data.taps]
        if self.spec.layers or self.vqt is not None:
            tokens, mask = data.batch_tokens(idx)
            extra += self.pools(tokens, mask)
            if self.vqt is not None:
                extra += self.vqt(tokens[len(self.spec.layers):], mask)
        if self.training and self.spec.array_drop > 0:
            keep = (torch.rand(len(idx), len(extra)) > self.spec.array_drop).float() / (1 - self.spec.array_drop)
            extra = [e * keep[:, i:i + 1] for i, e in enumerate(extra)]
        z = torch.cat([x, *extra], 1)
        if self.training and self.spec.noise > 0:
            z = z + self.spec.noise * torch.randn_like(z)
        return x + self.out(z)


def energy(head: TokenHead, data: "Data", a: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The l1 energy of each pair (one forward over the pairs' texts)."""
    both = torch.cat([a, p])
    y = head(data, both)
    return (y[:len(a)] - y[len(a):]).abs().sum(-1)


def pearson_loss(e: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    e, y = e - e.mean(), y - y.mean()
    return 1 + (e * y).sum() / (e.norm() * y.norm()).clamp_min(1e-12)


@torch.no_grad()
def spearman(head: TokenHead, data: Data, split: str) -> float:
    head.eval()
    a, p, y = data.pairs[split]
    e = torch.cat([energy(head, data, a[i:i + 512], p[i:i + 512]) for i in range(0, len(a), 512)])
    return float(spearmanr(-e.numpy(), y.numpy()).statistic)


def distill_loss(head: TokenHead, teacher: tuple[TokenHead, Data] | None, data: Data, a: torch.Tensor,
                 p: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Self-distillation: the teacher's energies on the batch's pairs and on as many shuffled pairs, matched up to
    scale (1 - Pearson)."""
    if teacher is None:
        return torch.zeros(())
    shuffled = p[torch.randperm(len(p))]
    with torch.no_grad():
        target = torch.cat([energy(*teacher, a, p), energy(*teacher, a, shuffled)])
    return pearson_loss(-torch.cat([e, energy(head, data, a, shuffled)]), target)


def train(data: Data, spec: Spec, seed: int, teacher: tuple[TokenHead, Data] | None, epochs: int = 10,
          batch: int = 64, patience: int = 3) -> tuple[TokenHead, dict]:
    torch.manual_seed(seed)
    head = TokenHead(data, spec)
    attention = [*head.queries.parameters(), *head.keys.parameters(),
                 *(head.vqt.parameters() if head.vqt is not None else [])]
    opt = torch.optim.AdamW([{"params": head.out.parameters()},
                             {"params": attention, "lr": spec.lr if spec.attn_lr is None else spec.attn_lr}],
                            lr=spec.lr, weight_decay=0.0)
    a, p, y = data.pairs["train"]
    snapshot = lambda: {k: v.clone() for k, v in head.state_dict().items()}  # noqa: E731
    best, history, bad, t0 = (spearman(head, data, "dev"), 0, snapshot()), [], 0, time.perf_counter()
    history.append(round(best[0], 4))
    for epoch in range(1, epochs + 1):
        head.train()
        for b in torch.randperm(len(y)).split(batch):
            e = energy(head, data, a[b], p[b])
            loss = pearson_loss(e, y[b]) + spec.distill_weight * distill_loss(head, teacher, data, a[b], p[b], e)
            opt.zero_grad()
            loss.backward()
            opt.step()
        dev = spearman(head, data, "dev")
        history.append(round(dev, 4))
        if dev > best[0]:
            best, bad = (dev, epoch, snapshot()), 0
        elif (bad := bad + 1) >= patience:
            break
    seconds = time.perf_counter() - t0
    head.load_state_dict(best[2])
    head.eval()
    return head, {"dev": round(best[0], 4), "best_epoch": best[1], "dev_history": history,
                  "train_seconds": round(seconds, 1),
                  "parameters": sum(x.numel() for x in head.parameters())}


def run(a, key: str, seed: int) -> dict:
    out = Path(a.out) / f"{key}-s{seed}.json"
    if out.exists():
        return json.loads(out.read_text())
    spec = CANDIDATES[key]
    data = Data(a.store, a.data, Path(a.cache), spec)
    teacher = None
    if spec.distill:  # trained afresh on the same store, at another seed than the student's
        teacher_data = Data(a.store, a.data, Path(a.cache), CANDIDATES[spec.distill])
        teacher = (train(teacher_data, CANDIDATES[spec.distill], seed + 1000, None)[0], teacher_data)
    head, record = train(data, spec, seed, teacher)
    record.update({"key": key, "seed": seed, "spec": spec.__dict__, "test": round(spearman(head, data, "test"), 4),
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": list(_load())})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    return record


def _load() -> tuple[float, ...]:
    import os
    return tuple(round(x, 2) for x in os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--cache", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--candidates", default=",".join(CANDIDATES))
    p.add_argument("--seeds", default="0")
    p.add_argument("--json", help="collect every finished run under --out into this file")
    a = p.parse_args()
    torch.set_num_threads(2)
    for key in a.candidates.split(","):
        for seed in [int(s) for s in a.seeds.split(",")]:
            r = run(a, key, seed)
            print(f"{key} s{seed}: dev {r['dev']:.4f} (epoch {r['best_epoch']}) test {r['test']:.4f} "
                  f"{r['train_seconds']} s load {r['load']} {r['dev_history']}", flush=True)
    if a.json:
        runs = [json.loads(f.read_text()) for f in sorted(Path(a.out).glob("*.json"))]
        Path(a.json).write_text(json.dumps({"runs": runs}, indent=1))


if __name__ == "__main__":
    main()
