"""`headstore.Pipeline`: new texts -> the encoder exactly as the head's store was built -> the head.

    head = headstore.Head.load("runs/scifact-l1")
    pipe = headstore.Pipeline.from_head(head)              # the store's encoder, pooling, layer, max length
    z = pipe.encode(["a new query"], batch_size=32)        # (1, d) numpy: what the head gives stored texts
    E = pipe.score(["a query"], ["doc one", "doc two"])    # (1, 2) energies, low = relevant

Texts go through the same steps as `cli featurize`: `encode.tokenize` (truncation at the store's max
length), `encode.collate`, `encode.encode_batch` (the one encode-and-pool step, `pooling.pooled_forward`,
in the store's numerics: its encoder's weights held in bf16/fp16 where the store's were, else fp32 weights
under the store's precision; featurize.encoder.resolved.store_numerics, packed.hold_numerics), a round trip
through the store's dtype (float16 stores round there), then the head's normaliser and MLP. So a text's `encode`
equals the head applied to its stored features up to batch-composition rounding (~1e-6 in fp32; within
the store's half precision for a bf16/fp16 store).

The encoder must be the one that built the head's store: its weights and tokenizer hashes and the
encoding code version are checked against the fingerprint parts the head carries; anything else is
refused (ValueError naming the differing parts).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from headstore.data.progress import progress_bar
from headstore.data.text_id import ROLES
from headstore.featurize.encoder.encode import CODE_VERSION, Batch, collate, encode_batch, prompt_length, tokenize
from headstore.featurize.encoder.model import load_encoder, model_identity
from headstore.featurize.encoder.packed import hold_numerics
from headstore.featurize.encoder.resolved import store_numerics
from headstore.featurize.encoder.pooling import Pooler
from headstore.featurize.encoder.sentence import SentenceSpec
from headstore.featurize.store.rows import unit_rows
from headstore.featurize.store.layout import array_names, fingerprint_of
from headstore.heads.scoring.energy import pairwise_energy
from headstore.heads.network.features import array_list
from headstore.heads.artefacts.head import Head

ENCODER_PARTS = ("weights_hash", "tokenizer_hash", "code_version")  # what an encoder must match


def encoder_source(head: Head, model: str | None = None) -> str:
    """Where the head's encoder is: `model` if given, else a fine-tuned head's encoder_dir, else the
    `--model` its store was featurized with (the store's config.json), else the store's model id."""
    if model:
        return str(model)
    if head.config.get("encoder_dir") and Path(head.config["encoder_dir"]).is_dir():
        return head.config["encoder_dir"]
    store = head.config.get("store")
    if store and (Path(store) / "config.json").is_file():
        featurized_with = json.loads((Path(store) / "config.json").read_text()).get("model")
        if featurized_with:
            return featurized_with
    model_id = head.store_manifest.get("model_id")
    if not model_id:
        raise ValueError(f"{head.source}: its config names no encoder; give the one its store was featurized with")
    return model_id


def check_encoder(head: Head, name: str) -> None:
    """ValueError unless the encoder at `name` makes the features the head was trained on."""
    parts = head.store_manifest
    missing = [k for k in ("pooling", "layers", "max_length", "dtype") if k not in parts]
    if missing:
        raise ValueError(f"{head.source}: its config lacks the store's {missing}; cannot rebuild its features")
    identity = model_identity(name, int(parts["max_length"]))
    here = {"weights_hash": identity.weights_hash, "tokenizer_hash": identity.tokenizer_hash,
            "code_version": CODE_VERSION}
    differs = [f"{k}: the head's store has {parts.get(k)!r}, this encoder gives {here[k]!r}"
               for k in ENCODER_PARTS if parts.get(k) != here[k]]
    if not differs and "fingerprint" in parts and all(k in parts for k in ("model_id", "precision")):
        if fingerprint_of({**parts, **here}) != head.store_fingerprint:
            differs.append("the store's fingerprint parts do not hash to the head's store fingerprint")
    if differs:
        raise ValueError(f"{name}: not the encoder that built the features {head.source} was trained on "
                         f"(store fingerprint {head.store_fingerprint[:12]}); differing:\n  " + "\n  ".join(differs)
                         + "\ngive the encoder the store was featurized with (--model)")


class Pipeline:
    """Encoder + pooling exactly as the head's store was built, then the head."""

    def __init__(self, encoder, head: Head, model_source: str):
        parts = head.store_manifest
        self.encoder, self.head, self.model_source = encoder, head, model_source
        self.spec = SentenceSpec.from_parts(parts)
        self.pooler = Pooler.of(self.spec, encoder.identity.model_dir)
        names = array_names(parts["layers"])
        unknown = [a for a in array_list(head.array) if a not in names]
        if unknown:
            raise ValueError(f"{head.source}: array {unknown[0]!r} is not one of the store's {sorted(names)}")
        self.layers = tuple(names[a] for a in array_list(head.array))  # a mixing head takes several, side by side
        self.layer = self.layers[0]
        self.normalized = [self.spec.normalize and layer == -1 for layer in self.layers]  # read as the store reads
        self.precision = parts.get("precision", "fp32")
        self.numerics = store_numerics(parts)  # weights in bf16/fp16, or fp32 (under bf16 autocast): as the store
        if encoder.path is None:
            hold_numerics(encoder, self.numerics)
        elif encoder.path.numerics != self.numerics:
            raise ValueError(f"the encoder was prepared for {encoder.path.numerics} numerics; {head.source}'s store "
                             f"was encoded in {self.numerics}: give a freshly loaded encoder")
        self.store_dtype = np.dtype(parts["dtype"])
        self.max_length = int(parts["max_length"])
        self.last_truncated = 0  # texts cut at max_length by the last `features` call

    @classmethod
    def from_head(cls, head: Head | str, model: str | None = None, device: str = "auto") -> "Pipeline":
        """The head's own encoder (see `encoder_source`), checked against the head's store fingerprint."""
        head = head if isinstance(head, Head) else Head.load(head)
        name = encoder_source(head, model)
        check_encoder(head, name)
        encoder = load_encoder(name, device, int(head.store_manifest["max_length"]))
        return cls(encoder, head, name)

    def __repr__(self) -> str:
        return (f"Pipeline({self.model_source!r}, {self.spec.describe()}, layer {self.layer if len(self.layers) == 1 else list(self.layers)}, "
                f"max_length {self.max_length}, {self.numerics}, head {self.head!r})")

    def prompt(self, role: str) -> str:
        """The prompt the head's store encoded texts of `role` under ("" for none)."""
        if role not in ROLES:
            raise ValueError(f"role {role!r}; valid: {list(ROLES)}")
        return (self.head.store_manifest.get("prompts") or {}).get(role, "")

    def features(self, texts: Sequence[str], batch_size: int = 32, progress: bool = False,
                 role: str = "document") -> np.ndarray:
        """Pooled encoder features of `texts` in `role` as the store holds them: (n, D) float32."""
        if isinstance(texts, str):
            raise ValueError("give a list of texts, not one string")
        texts = list(texts)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        dim = self.head.in_dim
        out = np.zeros((len(texts), dim), dtype=np.float32)
        if not texts:
            return out
        prompt = self.prompt(role)
        tok = tokenize(self.encoder.tokenizer, [prompt + t for t in texts], self.max_length)
        skip = torch.full((batch_size,), prompt_length(self.encoder.tokenizer, prompt), dtype=torch.int64)
        self.last_truncated = int(tok.truncated.sum())  # texts cut at max_length in the last call (said by callers)
        order = np.argsort(-tok.n_tokens, kind="stable")  # longest first: little padding per batch
        pad_id = self.encoder.tokenizer.pad_token_id or 0
        bar = progress_bar(total=int(tok.n_tokens.sum()), unit="tok", desc="encode", disable=not progress)
        for start in range(0, len(texts), batch_size):
            idx = order[start:start + batch_size]
            input_ids, mask = collate([tok.ids[i] for i in idx], pad_id, pin=False)
            batch = Batch(start, input_ids, mask, int(tok.n_tokens[idx].sum()))
            pooled = encode_batch(self.encoder, batch, self.pooler, self.layers, self.encoder.path.autocast,
                                  skip[:len(idx)])  # L x (B, D)
            rows = [p.cpu().numpy().astype(self.store_dtype).astype(np.float32) for p in pooled]  # the store's dtype
            rows = [unit_rows(r) if unit else r for r, unit in zip(rows, self.normalized)]  # as the store is read
            out[idx] = np.concatenate(rows, axis=1)  # (B, L * D)
            bar.update(batch.n_real_tokens)
        bar.close()
        return out

    def encode(self, texts: Sequence[str], batch_size: int = 32, progress: bool = False,
               role: str | None = None) -> np.ndarray:
        """Head outputs of `texts` encoded in `role`: "query" or "document" (unset: the document prompt, the role
        of symmetric data, and a head of both sides; a store without prompts encodes both alike). A query-side
        head (--sides query) needs the role: documents keep their normalised features. (n, d) float32 numpy."""
        features = self.features(texts, batch_size, progress, role or "document")
        return self.head.embed(features, role)

    def score(self, queries: Sequence[str], docs: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Energy of every query (query role) against every doc (document role), (Q, N); low = relevant."""
        q = torch.from_numpy(self.encode(queries, batch_size, role="query"))
        d = torch.from_numpy(self.encode(docs, batch_size, role="document"))
        return pairwise_energy(self.head.energy_name, q, d).numpy()
