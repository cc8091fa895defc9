"""`headstore.Head`: one trained head with everything needed to apply it outside headstore.

    head = headstore.Head.load("runs/scifact-l1")          # a `cli train-head --out` directory
    head = headstore.Head.load("runs/grid-stsb#rank=1")    # the dev-selected best of a `cli grid` output
    head = headstore.Head.load("runs/grid-stsb#id=3f2a...") # one head of a grid by its head_id
    head = headstore.Head.load("runs/grid-stsb#ensemble=3") # mean L1 energy of its 3 best configurations
    z = head.embed(features)                                # (n, D) stored features -> (n, d) outputs
    E = head.energy(features_a, features_b)                 # (n_a, n_b) energies, low = similar
    y = head.predict(features)                              # a classifier head (loss ce): (n,) class names

A head carries its normaliser (fitted on its training texts), its config (head shape, training
settings, dataset, array) and the fingerprint of the store whose features it was trained on; a
`Pipeline` (featurize.pipeline) uses that fingerprint to refuse an encoder that made other features.
On disk a head is a train-head-style directory: `head.safetensors` (a one-head stack),
`normalizer.safetensors`, `config.json`; `Head.save` writes one (`cli export --format safetensors`).
Every file is written and read by heads.artefacts.files.

A classifier head (`--loss ce`, heads.scoring.losses.ce) ends in its classes: `class_scores` gives (n, C)
scores (its outputs, or with one softmax per level of a label tree each class's summed log-probabilities),
`predict` the argmax as class names, `classes` their order (config.json "labels", written by train-head and
grid); it has no energy (`energy` refuses).

Ensembles: the mean L1 energy of K heads, as one head (`EnsembleHead`). For L1 energies the mean over
heads is itself an L1 energy: mean_k ||f_k(a) - f_k(b)||_1 = ||F(a) - F(b)||_1 with F(x) = [f_1(x); ...;
f_K(x)] / K. So an ensemble is one head whose output is its members' outputs side by side, scaled by 1/K:
`embed`, `energy`, `cli eval`, `cli index` and `cli export` treat it as any head (export to
sentence-transformers as block matrices when the members share their normaliser and layer shapes). On disk
it is a directory `ensemble.json` + one head directory per member (`member-1/`, ...). From a grid,
`GRID#ensemble=K` is the best-dev seed of each of the K best l1 configurations of the leaderboard (on the
best one's store array; in a grid of l1 heads only, the heads `GRID#rank=1` ... `GRID#rank=K` name),
chosen on dev only.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from headstore.data.text_id import ROLES
from headstore.heads.artefacts.files import (ENSEMBLE_ENERGY, ensemble_ids, is_ensemble_dir, load_grid_head,
                                       read_ensemble_dir, read_head_dir, write_ensemble_dir, write_head_dir)
from headstore.heads.artefacts.judged import copy_judgements
from headstore.heads.kinds.label_eval import class_scores
from headstore.heads.scoring.losses import LOSSES
from headstore.heads.settings.config import TrainConfig
from headstore.heads.scoring.energy import pairwise_energy
from headstore.heads.network.features import Normalizer
from headstore.heads.network.model import HeadConfig, StackedMLP
from headstore.heads.artefacts.soup import load_soup

GRID_REF = re.compile(r"(?P<key>rank|id|ensemble|soup)=(?P<value>.+)")  # what may follow '#' in a grid reference
EMBED_BATCH = 8192  # rows per forward pass; bounds memory, not results


class Head:
    """One head: `model` (a one-head StackedMLP), `normalizer`, `config` (config.json's content)."""

    def __init__(self, model: StackedMLP, normalizer: Normalizer, config: dict, source: str = ""):
        if model.n_heads != 1:
            raise ValueError(f"a Head holds one head; got a stack of {model.n_heads}")
        self.model = model.eval()
        self.normalizer = normalizer
        self.config = config
        self.source = source

    # --- loading and saving -------------------------------------------------------------------
    @classmethod
    def load(cls, ref: str | Path) -> "Head":
        """A `cli train-head --out` directory (or one `Head.save` / `cli export --format safetensors`
        wrote), or `GRID_DIR#rank=K` / `GRID_DIR#id=HEAD_ID` for one head of a `cli grid` output, or
        `GRID_DIR#ensemble=K` for the ensemble of its K best configurations (`EnsembleHead`)."""
        ref = str(ref)
        base, _, selector = ref.rpartition("#")
        match = GRID_REF.fullmatch(selector)
        if base and not match and not Path(ref).exists() and Path(base).is_dir():
            raise ValueError(f"{ref}: {selector!r} is no grid selector; after '#' give rank=K (the K-th "
                             "configuration by dev), id=HEAD_ID (results.csv), ensemble=K (the K best as one head) "
                             "or soup=K (the mean weights of K heads sharing their start)")
        if base and match and not Path(ref).exists():
            if match["key"] == "ensemble":
                return EnsembleHead.from_grid(base, match["value"])
            if match["key"] == "soup":  # the mean of the weights of K heads sharing their start (heads.artefacts.soup)
                return cls(*load_soup(base, match["value"]), ref)
            model, norm, config = load_grid_head(base, **{match["key"]: match["value"]})
            return cls(model, norm, config, ref)
        return cls._load_dir(Path(ref))

    @classmethod
    def _load_dir(cls, d: Path) -> "Head":
        if is_ensemble_dir(d):
            return EnsembleHead.load_dir(d)
        return cls(*read_head_dir(d), str(d))

    def save(self, out_dir: str | Path) -> Path:
        """Write a directory `Head.load` (and `cli eval --head`) reads: head, normaliser, config.json, and the
        training judgements where the head has them (heads.artefacts.judged)."""
        out = write_head_dir(out_dir, self.model, self.normalizer, self.config)
        copy_judgements(self.source, self.config, out)
        return out

    # --- what the head is ---------------------------------------------------------------------
    @property
    def head_config(self) -> HeadConfig:
        return self.model.cfg

    @property
    def train_config(self) -> TrainConfig:
        return TrainConfig.from_dict(self.config["train"])

    @property
    def energy_name(self) -> str:
        """The energy the head was trained and ranked with: l1, l2 or cosine."""
        return self.train_config.eval_energy

    @property
    def store_fingerprint(self) -> str:
        return self.config["store_fingerprint"]

    @property
    def store_manifest(self) -> dict:
        """The fingerprint parts of the store the head was trained on (model, pooling, max length, ...)."""
        return self.config.get("store_manifest", {})

    @property
    def array(self) -> str:
        return self.config.get("array", "features")

    @property
    def in_dim(self) -> int:
        """The width of the features `embed` takes: the store's dim, times the arrays a mixing head mixes."""
        return int(self.head_config.in_dim) * int(self.head_config.mix)

    @property
    def out_dim(self) -> int:
        return int(self.head_config.out_features)

    def __repr__(self) -> str:
        h = self.head_config
        return (f"Head({self.source!r}: depth {h.depth}, {self.in_dim}->{self.out_dim}, "
                f"{'residual, ' if h.residual and h.depth else ''}{self.config['train']['loss']}, "
                f"energy {self.energy_name}, normalize {self.normalizer.kind})")

    # --- applying it --------------------------------------------------------------------------
    def _inputs(self, features) -> torch.Tensor:
        x = torch.as_tensor(np.asarray(features, dtype=np.float32))
        if x.dim() == 1:
            x = x.unsqueeze(0)
        if x.dim() != 2 or x.shape[1] != self.in_dim:
            raise ValueError(f"features must be (n, {self.in_dim}) (the store's feature dim); got {tuple(x.shape)}")
        return x

    @property
    def query_side(self) -> bool:
        """True when queries and documents are embedded differently (`--sides query`: documents keep their
        normalised features)."""
        return self.head_config.sides == "query"

    def role_of(self, role: str | None) -> str:
        """The role texts are embedded in: `role`, or for a head of both sides "query" when none is given (both
        roles give the same outputs); a query-side head needs one (ValueError)."""
        if role is None and self.query_side:
            raise ValueError(f"{self.source or 'this head'} is a query-side head (--sides query): give role='query' "
                             "or role='document' (documents keep their normalised features)")
        if role is not None and role not in ROLES:
            raise ValueError(f"role {role!r}; valid: {list(ROLES)}")
        return role or "query"

    def embed_tensor(self, features, role: str | None = None) -> torch.Tensor:
        """Normaliser then head: (n, D) features of texts in `role` -> (n, d) float32 tensor."""
        x, role = self._inputs(features), self.role_of(role)
        with torch.no_grad():
            parts = [self.model.encode(self.normalizer(x[s:s + EMBED_BATCH]), role)[0]
                     for s in range(0, len(x), EMBED_BATCH)]
        return torch.cat(parts) if parts else torch.zeros(0, self.out_dim)

    def embed(self, features, role: str | None = None) -> np.ndarray:
        """Head outputs of stored (or Pipeline-pooled) features of texts in `role` ("query" or "document"; a head
        of both sides embeds both alike, a query-side head needs the role): (n, D) -> (n, d) float32 numpy."""
        return self.embed_tensor(features, role).numpy()

    def energy(self, a, b) -> np.ndarray:
        """Energy of every row of `a` (queries) against every row of `b` (documents), both features as `embed`
        takes them: (n_a, D), (n_b, D) -> (n_a, n_b); low = similar. The energy is the head's own (`energy_name`)."""
        if self.is_classifier:
            raise ValueError(f"{self.source or 'this head'} is a classifier head (loss ce): it scores classes, not "
                             "pairs; use predict / class_scores")
        za, zb = self.embed_tensor(a, "query"), self.embed_tensor(b, "document")
        return pairwise_energy(self.energy_name, za, zb).numpy()

    # --- a classifier head ----------------------------------------------------------------------
    @property
    def is_classifier(self) -> bool:
        """True for a head that ends in its classes (a loss whose outputs are classes: ce)."""
        return LOSSES[self.config["train"]["loss"]].outputs == "classes"

    @property
    def classes(self) -> list[str]:
        """The class names, in the order of `class_scores`' columns."""
        return list(self._label_space()["classes"])

    def _label_space(self) -> dict:
        if not self.is_classifier:
            raise ValueError(f"{self.source or 'this head'} is an energy head (loss {self.config['train']['loss']}): "
                             "it has no classes; train one with --loss ce, or classify by k-NN under its energy")
        if "labels" not in self.config:
            raise ValueError(f"{self.source or 'this head'}: its config.json names no classes (\"labels\"); "
                             "train it again with this version")
        return self.config["labels"]

    def class_scores(self, features) -> np.ndarray:
        """(n, D) features -> (n, C) class scores (argmax = `predict`; module doc)."""
        space = self._label_space()
        widths = [len(names) for names in space["nodes"]]
        z = self.embed_tensor(features)
        return class_scores(z, np.asarray(space["leaf_nodes"], dtype=np.int64).reshape(len(space["classes"]), -1),
                            widths).numpy()

    def predict(self, features) -> np.ndarray:
        """(n, D) features -> (n,) class names: the argmax of `class_scores`."""
        return np.asarray(self.classes, dtype=object)[self.class_scores(features).argmax(-1)]


class EnsembleModel(torch.nn.Module):
    """Raw features (B, D) -> (1, B, K * d): every member's normaliser and head, side by side, / K."""

    def __init__(self, members: list[Head]):
        super().__init__()
        self.members = members
        self.heads = torch.nn.ModuleList([m.model for m in members])  # for .eval() / .train()
        self.n_heads = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encode(x, "query")

    def encode(self, x: torch.Tensor, role: str = "query") -> torch.Tensor:
        """(B, D) or (1, B, D) raw features of texts in `role` -> (1, B, K * d)."""
        if x.dim() == 3:  # (1, B, D): a stack of one
            x = x[0]
        outs = [m.model.encode(m.normalizer(x), role)[0] for m in self.members]  # K x (B, d_k)
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
    def query_side(self) -> bool:
        return any(m.query_side for m in self.members)

    @property
    def out_dim(self) -> int:
        return sum(m.out_dim for m in self.members)

    def __repr__(self) -> str:
        return f"EnsembleHead({self.source!r}: mean L1 energy of {len(self.members)} heads, {self.in_dim}->{self.out_dim})"

    def save(self, out_dir: str | Path) -> Path:
        return write_ensemble_dir(out_dir, [(m.model, m.normalizer, m.config) for m in self.members], self.config)

    @classmethod
    def load_dir(cls, d: Path) -> "EnsembleHead":
        member_dirs, config = read_ensemble_dir(d)
        members = [Head._load_dir(m) for m in member_dirs]
        return cls(members, config.get("ensemble", {}).get("selection"), str(d))

    @classmethod
    def from_grid(cls, grid_dir: str | Path, k: int | str, seed: int | None = None) -> "EnsembleHead":
        """The ensemble of the K best l1 configurations of a grid (`artefacts.ensemble_groups`): of each, the
        head of `seed`, or its best-dev seed when seed is None."""
        ids = ensemble_ids(grid_dir, k, seed)
        members = [Head(*load_grid_head(grid_dir, id=i), f"{grid_dir}#id={i}") for i in ids]
        k = len(ids)
        selection = {"grid": str(grid_dir), "k": k, "seed": seed,
                     "rule": "the K best configurations by mean dev metric; " +
                             ("their heads of seed %d" % seed if seed is not None else "the best-dev seed of each")}
        return cls(members, selection, f"{grid_dir}#ensemble={k}")


def check_members(members: list[Head]) -> None:
    """Members must be L1 heads over the same features (store, array) to share one energy."""
    if not members:
        raise ValueError("an ensemble needs at least one head")
    energies = sorted({m.energy_name for m in members})
    if energies != [ENSEMBLE_ENERGY]:
        raise ValueError(f"an ensemble averages L1 energies; its heads use {energies} (only l1 heads can be "
                         "ensembled exactly as one head)")
    first = members[0]
    for m in members[1:]:
        if m.store_fingerprint != first.store_fingerprint or m.array != first.array:
            raise ValueError(f"ensemble members must share the store and array: {m.source} ({m.array}, store "
                             f"{m.store_fingerprint[:12]}) vs {first.source} ({first.array}, {first.store_fingerprint[:12]})")
