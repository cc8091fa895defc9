"""Head ensembles: the mean L1 energy of K heads, as one head.

For L1 energies the mean over heads is itself an L1 energy: mean_k ||f_k(a) - f_k(b)||_1 =
||F(a) - F(b)||_1 with F(x) = [f_1(x); ...; f_K(x)] / K. So an ensemble is one head whose output is
its members' outputs side by side, scaled by 1/K: `embed`, `energy`, `cli eval`, `cli index` and
`cli export` treat it as any head (export to sentence-transformers as block matrices when the members
share their normaliser and layer shapes).

On disk an ensemble is a directory `Head.load` reads: `ensemble.json` (format, members, how they were
chosen) and one train-head-style directory per member (`member-1/`, ...). From a grid,
`GRID#ensemble=K` is the best-dev seed of each of the K best l1 configurations of the leaderboard (on the
best one's store array; in a grid of l1 heads only, the heads `GRID#rank=1` ... `GRID#rank=K` name),
chosen on dev only.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from headstore.data.files import atomic_write_json
from headstore.heads.features import Normalizer
from headstore.heads.head import Head

ENSEMBLE_FILE = "ensemble.json"
ENSEMBLE_FORMAT = "headstore.ensemble/1"
ENERGY = "l1"  # the one energy whose mean over heads is the energy of the concatenated outputs


class EnsembleModel(torch.nn.Module):
    """Raw features (B, D) -> (1, B, K * d): every member's normaliser and head, side by side, / K."""

    def __init__(self, members: list[Head]):
        super().__init__()
        self.members = members
        self.heads = torch.nn.ModuleList([m.model for m in members])  # for .eval() / .train()
        self.n_heads = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3:  # (1, B, D): a stack of one
            x = x[0]
        outs = [m.model(m.normalizer(x))[0] for m in self.members]  # K x (B, d_k)
        return (torch.cat(outs, dim=-1) / len(outs)).unsqueeze(0)


class EnsembleHead(Head):
    """K heads whose energy is the mean of their L1 energies (module doc); `members` are the Heads."""

    def __init__(self, members: list[Head], selection: dict | None = None, source: str = ""):
        check_members(members)
        self.members = members
        first = members[0]
        config = {k: v for k, v in first.config.items() if k not in ("grid", "best_epoch", "train_seconds")}
        config["ensemble"] = {"k": len(members), "members": [m.source for m in members],
                              **({"selection": selection} if selection else {})}
        self.model = EnsembleModel(members).eval()
        self.normalizer = Normalizer.fit("none", torch.zeros(1, 1))
        self.config = config
        self.source = source

    @property
    def head_config(self):
        return self.members[0].head_config

    @property
    def in_dim(self) -> int:
        return self.members[0].in_dim

    @property
    def out_dim(self) -> int:
        return sum(m.out_dim for m in self.members)

    def __repr__(self) -> str:
        return f"EnsembleHead({self.source!r}: mean L1 energy of {len(self.members)} heads, {self.in_dim}->{self.out_dim})"

    def save(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        names = []
        for i, m in enumerate(self.members, 1):
            names.append(f"member-{i}")
            Head.save(m, out / names[-1])
        atomic_write_json(out / ENSEMBLE_FILE, {"format": ENSEMBLE_FORMAT, "members": names,
                                                 "config": self.config}, sort_keys=True)
        return out

    @classmethod
    def load_dir(cls, d: Path) -> "EnsembleHead":
        try:
            info = json.loads((d / ENSEMBLE_FILE).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{d / ENSEMBLE_FILE}: not valid JSON ({e}) (the ensemble is damaged; export it again)") from None
        if not isinstance(info, dict) or info.get("format") != ENSEMBLE_FORMAT or not info.get("members"):
            raise ValueError(f"{d / ENSEMBLE_FILE}: not a headstore ensemble (format {ENSEMBLE_FORMAT!r} with members)")
        members = [Head._load_dir(d / name) for name in info["members"]]
        head = cls(members, info.get("config", {}).get("ensemble", {}).get("selection"), str(d))
        return head


def check_members(members: list[Head]) -> None:
    """Members must be L1 heads over the same features (store, array) to share one energy."""
    if not members:
        raise ValueError("an ensemble needs at least one head")
    energies = sorted({m.energy_name for m in members})
    if energies != [ENERGY]:
        raise ValueError(f"an ensemble averages L1 energies; its heads use {energies} (only l1 heads can be "
                         "ensembled exactly as one head)")
    first = members[0]
    for m in members[1:]:
        if m.store_fingerprint != first.store_fingerprint or m.array != first.array:
            raise ValueError(f"ensemble members must share the store and array: {m.source} ({m.array}, store "
                             f"{m.store_fingerprint[:12]}) vs {first.source} ({first.array}, {first.store_fingerprint[:12]})")


def ensemble_groups(frame) -> list:
    """The configurations an ensemble of a grid draws from, best first (the leaderboard's order, dev only):
    those trained with the l1 energy (mnr is cosine) on the same store array as the best of them."""
    from headstore.heads.experiments.report import ranked_configs

    groups, _ = ranked_configs(frame)
    l1 = [g for g in groups if g["loss"][0] != "mnr" and g["energy"][0] == ENERGY]
    return [g for g in l1 if g["array"][0] == l1[0]["array"][0]] if l1 else []


def grid_ensemble(grid_dir: str | Path, k: int | str, seed: int | None = None) -> EnsembleHead:
    """The ensemble of the K best l1 configurations of a grid (`ensemble_groups`): of each, the head of
    `seed`, or its best-dev seed when seed is None."""
    from headstore.heads.experiments.grid_heads import _results, load_grid_head

    try:
        k = int(k)
    except (TypeError, ValueError):
        raise ValueError(f"grid reference ensemble={k!r}: give a positive integer, e.g. {grid_dir}#ensemble=3") from None
    groups = ensemble_groups(_results(Path(grid_dir)))
    if not 1 <= k <= len(groups):
        raise ValueError(f"{grid_dir}: ensemble of {k} out of range; the grid has {len(groups)} trained l1 "
                         "configurations on one array")
    members = []
    for rank, group in enumerate(groups[:k], 1):
        if seed is not None:
            rows = group.filter(group["seed"] == seed)
            if rows.is_empty():
                raise ValueError(f"{grid_dir}: configuration of rank {rank} has no head of seed {seed}")
            model, norm, config = load_grid_head(grid_dir, id=rows["head_id"][0])
            source = f"{grid_dir}#id={rows['head_id'][0]}"
        else:
            best = group.sort("dev_primary", descending=True, nulls_last=True, maintain_order=True)
            model, norm, config = load_grid_head(grid_dir, id=best["head_id"][0])
            source = f"{grid_dir}#id={best['head_id'][0]}"
        members.append(Head(model, norm, config, source))
    selection = {"grid": str(grid_dir), "k": k, "seed": seed,
                 "rule": "the K best configurations by mean dev metric; " +
                         ("their heads of seed %d" % seed if seed is not None else "the best-dev seed of each")}
    return EnsembleHead(members, selection, f"{grid_dir}#ensemble={k}")
