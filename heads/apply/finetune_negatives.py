"""`cli finetune`'s negatives: mined once on the stored features (the head's own), and fed to the training
step from a cache of their sentence embeddings refreshed once per epoch.

Every text finetune encodes goes through `RowEncoder`, the shared encode-and-pool step
(heads.apply.row_inputs.sentence_embeddings, the store's pooling and numerics): with gradients for a
training batch's anchors and positives, and without (`frozen`: eval mode, no grad, batched by tokens) for
the negatives cache and dev scoring.

The cache is the asynchronous negative cache of ANCE (Xiong et al. 2021, "Approximate Nearest Neighbor
Negative Contrastive Learning for Dense Text Retrieval"): the negatives' embeddings come from a recent
checkpoint of the encoder (here: the one at the start of the epoch) instead of a forward pass with
gradients in every step. Each step passes the batch's cached negatives through the Normalizer and the head
WITH gradients, so the head learns from them as train-head's head does; the encoder gets its gradients
from the anchors and positives only. Memory: one (n unique negatives, D) float32 matrix, where encoding
the head's 8 mined negatives per pair with gradients needed ~22 GB for one SciFact batch on a CPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from headstore.featurize.encoder.encode import plan_batches
from headstore.featurize.encoder.pooling import Pooler
from headstore.heads.apply.row_inputs import RowInputs, sentence_embeddings
from headstore.heads.evaluation.mining import mine_negatives
from headstore.heads.network.features import load_features
from headstore.heads.scoring.losses import LOSSES

# padded tokens per no-grad forward batch: featurize's CPU default (a batch's activations stay in cache);
# a GPU wants far more (featurize's cli uses 65536 there)
BATCH_TOKENS = {"cpu": 4096, "cuda": 65536}
# modelled cost of one forward call in padded tokens (featurize.encoder.encode.plan_batches): featurize's CPU figure for
# bf16 (a call costs ~100 fp32 tokens of work, ~3x that in bf16); on a GPU the budget itself (calls are dear)
BATCH_OVERHEAD = {"cpu": 512}
MAX_BATCH = 512  # texts per no-grad batch whatever their length


def mined_negatives(src, cfg) -> torch.Tensor | None:
    """(P, K) store rows: given negatives, plus hard negatives mined once on the stored features (cfg.mined_k,
    None: the head's own mined_k; the same negatives as the head it starts from)."""
    spec, pairs, train_cfg = LOSSES[src.train_cfg.loss], src.pairs, src.train_cfg
    negatives = torch.as_tensor(pairs.negative) if spec.negatives and pairs.negative is not None else None
    mined_k = train_cfg.mined_k if cfg.mined_k is None else cfg.mined_k
    if spec.negatives and mined_k and src.task.corpus_rows is not None:
        mined = mine_negatives(load_features(src.store, src.array), pairs.anchor, src.task.corpus_rows,
                               src.task.relevant, mined_k, None, 1, energy=train_cfg.eval_energy)[0]
        negatives = mined if negatives is None else torch.cat([negatives, mined], dim=-1)
    return negatives


@dataclass
class RowEncoder:
    """Store rows -> (B, D) float32 sentence embeddings through the encoder being trained, each row's text under
    the prompt featurize gave it (heads.apply.row_inputs), pooled as the store pooled it."""

    model: torch.nn.Module
    tokenizer: object
    inputs: RowInputs
    max_length: int
    pooler: Pooler
    layer: int
    device: torch.device
    use_bf16: bool | str  # the store's numerics: a compute_context precision (row_inputs.tuning_precision)
    version: int = 0  # bumped by every optimiser step: `frozen`'s memo holds one version's embeddings
    _memo: dict = field(default_factory=dict)
    _memo_version: int = -1

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """One training batch, with gradients, in the model's current mode."""
        texts, prompt_lengths = self.inputs(rows.tolist())
        return sentence_embeddings(self.model, self.tokenizer, texts, self.max_length, self.pooler, self.layer,
                                   self.device, self.use_bf16, prompt_lengths)

    def frozen(self, rows) -> torch.Tensor:
        """(n, D) float32 on the device: eval mode (no dropout), no gradients, batched by tokens. Rows encoded
        since the last optimiser step are reused (dev scoring at an epoch's end and the next epoch's cache
        refresh see the same encoder, and share the documents they both need)."""
        rows = [int(r) for r in np.asarray(rows).reshape(-1)]
        if self._memo_version != self.version:
            self._memo, self._memo_version = {}, self.version
        todo = sorted(set(rows) - set(self._memo))
        if todo:
            was_training = self.model.training
            self.model.eval()
            try:
                with torch.no_grad():
                    for part, emb in self._batches(todo):
                        self._memo.update(zip(part, emb))
            finally:
                self.model.train(was_training)
        if not rows:
            return torch.zeros(0, 0, device=self.device)
        return torch.stack([self._memo[r] for r in rows])

    def state(self) -> dict:
        """The step count and the current encoder's memo (finetune_resume: the next epoch's cache refresh reuses
        the last dev scoring's embeddings, as an uninterrupted run does, so a resumed run encodes in the same
        batches); a memo of an older encoder is left out (it would never be read)."""
        rows = list(self._memo) if self._memo_version == self.version else []
        embeddings = torch.stack([self._memo[r] for r in rows]).cpu() if rows else None
        return {"version": self.version, "rows": rows, "embeddings": embeddings}

    def load(self, state: dict) -> None:
        self.version = self._memo_version = int(state["version"])
        rows, embeddings = state["rows"], state["embeddings"]
        self._memo = {} if not rows else dict(zip(rows, embeddings.to(self.device).unbind(0)))

    def _batches(self, rows: list[int]):
        """(rows, (b, D) embeddings) of `rows` in batches of at most BATCH_TOKENS padded tokens (longest first,
        featurize.encoder.encode.plan_batches)."""
        texts, prompt_lengths = self.inputs(rows)
        n_tokens = np.fromiter((len(x) for x in self.tokenizer(texts, truncation=True, max_length=self.max_length)
                                ["input_ids"]), dtype=np.int64, count=len(texts))
        budget = BATCH_TOKENS.get(self.device.type, BATCH_TOKENS["cuda"])
        order, batches = plan_batches(n_tokens, [f"{r:012d}" for r in rows], budget, MAX_BATCH,
                                      BATCH_OVERHEAD.get(self.device.type, budget))
        for start, stop in batches:
            idx = order[start:stop].tolist()
            emb = sentence_embeddings(self.model, self.tokenizer, [texts[i] for i in idx], self.max_length,
                                      self.pooler, self.layer, self.device, self.use_bf16, prompt_lengths[idx])
            yield [rows[i] for i in idx], emb.float()


class NegativeCache:
    """The negatives' sentence embeddings under the encoder of the epoch's start (module doc: ANCE's
    asynchronous cache). `negatives` (P, K) store rows; `refresh` encodes each unique row once; `__call__`
    gives a batch's (b, K, D) from the cache, without gradients into the encoder."""

    def __init__(self, negatives: torch.Tensor):
        self.rows, inverse = torch.unique(negatives, return_inverse=True)  # (U,), (P, K) positions in rows
        self.index = inverse.reshape(negatives.shape)
        self.embeddings: torch.Tensor | None = None  # (U, D) float32

    def refresh(self, encoder: RowEncoder) -> None:
        self.embeddings = encoder.frozen(self.rows.numpy())

    def __call__(self, idx: torch.Tensor) -> torch.Tensor:
        assert self.embeddings is not None, "refresh the cache before the epoch's first step"
        return self.embeddings[self.index[idx].to(self.embeddings.device)]  # (b, K, D)

    def __len__(self) -> int:
        return len(self.rows)

    def megabytes(self) -> float:
        return 0.0 if self.embeddings is None else self.embeddings.numel() * 4 / 2 ** 20

