"""`headstore.Head`: one trained head with everything needed to apply it outside headstore.

    head = headstore.Head.load("runs/scifact-l1")          # a `cli train-head --out` directory
    head = headstore.Head.load("runs/grid-stsb#rank=1")    # the dev-selected best of a `cli grid` output
    head = headstore.Head.load("runs/grid-stsb#id=3f2a...") # one head of a grid by its head_id
    head = headstore.Head.load("runs/grid-stsb#ensemble=3") # mean L1 energy of its 3 best configurations
    z = head.embed(features)                                # (n, D) stored features -> (n, d) outputs
    E = head.energy(features_a, features_b)                 # (n_a, n_b) energies, low = similar

A head carries its normaliser (fitted on its training texts), its config (head shape, training
settings, dataset, array) and the fingerprint of the store whose features it was trained on; a
`Pipeline` (featurize.pipeline) uses that fingerprint to refuse an encoder that made other features.
On disk a head is a train-head-style directory: `head.safetensors` (a one-head stack),
`normalizer.safetensors`, `config.json`; `Head.save` writes one (`cli export --format safetensors`).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import torch

from headstore.data.files import atomic_write_json
from headstore.heads.config import TrainConfig
from headstore.heads.energy import pairwise_energy
from headstore.heads.features import Normalizer
from headstore.heads.model import HeadConfig, StackedMLP, load_heads, save_heads

HEAD_FILE, NORMALIZER_FILE, CONFIG_FILE = "head.safetensors", "normalizer.safetensors", "config.json"
GRID_REF = re.compile(r"(?P<key>rank|id|ensemble)=(?P<value>.+)")  # what may follow '#' in a grid reference
EMBED_BATCH = 8192  # rows per forward pass; bounds memory, not results


def read_head_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file (a `cli train-head --out` folder holds config.json "
                                "beside head.safetensors)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        where = f"line {e.lineno}" if isinstance(e, json.JSONDecodeError) else f"byte {e.start}"
        raise ValueError(f"{path}: not valid JSON ({where}: {e.msg if hasattr(e, 'msg') else e.reason}) "
                         "(the head's config is broken; retrain the head)") from None
    missing = [k for k in ("train", "store_manifest") if not isinstance(config, dict) or k not in config]
    if missing:
        raise ValueError(f"{path}: not a head config (missing {', '.join(missing)}) (retrain the head)")
    try:
        TrainConfig.from_dict(config["train"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: its \"train\" settings are not valid: {e} (retrain the head)") from None
    return config


def load_safetensors(path: Path, load):
    """load(path), with a damaged file (truncated, not safetensors) reported as the file and its problem."""
    try:
        return load(path)
    except (ValueError, FileNotFoundError):
        raise
    except Exception as e:  # safetensors raises SafetensorError / OSError for a truncated file
        raise ValueError(f"{path}: cannot be read ({type(e).__name__}: {str(e).strip()[:200]}) "
                         "(the file is truncated or damaged; retrain the head)") from None


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
        `GRID_DIR#ensemble=K` for the ensemble of its K best configurations (heads.ensemble)."""
        ref = str(ref)
        base, _, selector = ref.rpartition("#")
        if base and GRID_REF.fullmatch(selector) and not Path(ref).exists():
            from headstore.heads.experiments.grid_heads import load_grid_head

            match = GRID_REF.fullmatch(selector)
            if match["key"] == "ensemble":
                from headstore.heads.ensemble import grid_ensemble

                return grid_ensemble(base, match["value"])
            model, norm, config = load_grid_head(base, **{match["key"]: match["value"]})
            return cls(model, norm, config, ref)
        return cls._load_dir(Path(ref))

    @classmethod
    def _load_dir(cls, d: Path) -> "Head":
        from headstore.heads.ensemble import ENSEMBLE_FILE, EnsembleHead

        if (d / ENSEMBLE_FILE).is_file() and not (d / HEAD_FILE).is_file():
            return EnsembleHead.load_dir(d)
        if (d / "results.parquet").is_file() and not (d / HEAD_FILE).is_file():
            raise ValueError(f"{d} is a `cli grid` output; name one of its heads: '{d}#rank=1' (the dev-selected "
                             f"best) or '{d}#id=<head_id>' (see its results.csv)")
        if not (d / HEAD_FILE).is_file():
            raise FileNotFoundError(f"{d}: no {HEAD_FILE} (is this a `cli train-head --out` directory?)")
        if not (d / CONFIG_FILE).is_file():
            raise FileNotFoundError(f"{d}: no {CONFIG_FILE} beside {HEAD_FILE}; the head cannot be applied "
                                    "without its settings")
        config = read_head_config(d / CONFIG_FILE)
        model = load_safetensors(d / HEAD_FILE, load_heads)
        if model.n_heads != 1:
            model = model.head_slice(int(config.get("stack_index", 0)))
        norm_path = d / NORMALIZER_FILE
        norm = load_safetensors(norm_path, Normalizer.load) if norm_path.is_file() \
            else Normalizer.fit("none", torch.zeros(1, 1))
        return cls(model, norm, config, str(d))

    def save(self, out_dir: str | Path) -> Path:
        """Write a directory `Head.load` (and `cli eval --head`) reads: head, normaliser, config.json."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        save_heads(out / HEAD_FILE, self.model)
        self.normalizer.save(out / NORMALIZER_FILE)
        atomic_write_json(out / CONFIG_FILE, self.config, sort_keys=True)
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

    def embed_tensor(self, features) -> torch.Tensor:
        """Normaliser then head: (n, D) features -> (n, d) float32 tensor."""
        x = self._inputs(features)
        with torch.no_grad():
            parts = [self.model(self.normalizer(x[s:s + EMBED_BATCH]))[0] for s in range(0, len(x), EMBED_BATCH)]
        return torch.cat(parts) if parts else torch.zeros(0, self.out_dim)

    def embed(self, features) -> np.ndarray:
        """Head outputs of stored (or Pipeline-pooled) features: (n, D) -> (n, d) float32 numpy."""
        return self.embed_tensor(features).numpy()

    def energy(self, a, b) -> np.ndarray:
        """Energy of every row of `a` against every row of `b` (features, as `embed` takes them):
        (n_a, D), (n_b, D) -> (n_a, n_b); low = similar. The energy is the head's own (`energy_name`)."""
        return pairwise_energy(self.energy_name, self.embed_tensor(a), self.embed_tensor(b)).numpy()
