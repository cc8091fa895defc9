"""What featurize gave the encoder for each store row: its text under the prompt of the role it was stored in.

A store made with prompts (E5/BGE-style models, `cli featurize --query-prompt`) holds each text once per role,
encoded as prompt + text, and a model whose Pooling leaves the prompt out (`include_prompt: false`) pools
without the prompt's tokens (featurize.run.windows.encode_in_plan_order). Fine-tuning re-encodes store rows with the
encoder it trains, so it must give the encoder the same inputs: the row's prompt is found from the row id
itself (`row_id(text, prompt)`, data.text_id), one of the store's role prompts (its manifest's `prompts`),
and its length counted as featurize counts it (featurize.encoder.encode.prompt_length). `sentence_embeddings` is
what featurize stores for such inputs, through the encoder being trained (gradients flow), in the precision
`tuning_precision` picks from the store's numerics.
"""
from __future__ import annotations

import torch

from headstore.data.text_id import row_id
from headstore.featurize.encoder.config import NUMERICS
from headstore.featurize.encoder.encode import prompt_length
from headstore.featurize.encoder.hardware import warn_if_emulated_bf16
from headstore.featurize.encoder.pooling import Pooler, pooled_forward
from headstore.featurize.encoder.resolved import store_numerics
from headstore.featurize.store.layout import StoreError


class RowInputs:
    """Store rows -> (prompt + text of each, prompt tokens of each (B,)), as featurize encoded them."""

    def __init__(self, store, tokenizer):
        frame = store.texts.sort("row")
        self.texts: list[str] = frame["text"].to_list()
        self.ids: list[str] = frame["text_id"].to_list()
        self.store_path = store.path
        # "" first: a role without a prompt (and every row of a store made without prompts) is its bare text
        self.prompts = ["", *sorted({p for p in store.prompts.values() if p})]
        self.lengths = {p: prompt_length(tokenizer, p) for p in self.prompts}

    def prompt_of(self, row: int) -> str:
        """The prompt store row `row` was encoded under (StoreError when its id fits none of the store's)."""
        text, key = self.texts[row], self.ids[row]
        if len(self.prompts) == 1:
            return ""
        for prompt in self.prompts:
            if row_id(text, prompt) == key:
                return prompt
        raise StoreError(f"{self.store_path}: row {row}'s id fits none of the store's prompts "
                         f"{self.prompts[1:]} (run `cli store verify {self.store_path}`)")

    def __call__(self, rows) -> tuple[list[str], torch.Tensor]:
        prompts = [self.prompt_of(int(r)) for r in rows]
        texts = [p + self.texts[int(r)] for p, r in zip(prompts, rows)]
        return texts, torch.as_tensor([self.lengths[p] for p in prompts], dtype=torch.int64)  # (B,)


def tuning_precision(parts: dict, device_type: str, half: bool = True) -> str:
    """The autocast (pooling.compute_context's precision) an encoder trains in on a store with fingerprint `parts`.

    Mixed precision in the store's half dtype: the master weights stay fp32 (AdamW's small updates would vanish
    in bf16 weights), the forward runs under autocast in the dtype the store's encoder computed in: bf16 for a
    bf16 store (bf16-weights or bf16-autocast) on CUDA and on a CPU (AVX-512-BF16/AMX run it natively; where
    emulated, one warning), fp16 for an fp16-weights store on CUDA (fp32 on a CPU: fp16 is emulated there, and
    featurize refuses it). An fp32 store trains in fp32 on a CPU and, as before, under bf16 autocast on CUDA
    (tensor cores; the tuned encoder gets its own store). half=False (FinetuneConfig.bf16 off): fp32 throughout.

    Encoding without gradients (dev scoring, negatives' embeddings) takes the same autocast on the training
    weights: a bf16-weights store rounds the weights and every state to bf16 where autocast rounds only each
    matmul's inputs, a difference of about one bf16 rounding (3e-3 of a feature, tests/heads/test_store_numerics.py)
    that a dev figure cannot resolve, while holding the store's exact numerics would need a half copy of the
    weights after every step."""
    weights, autocast = NUMERICS[store_numerics(parts)]
    dtype = autocast or weights
    if not half or (dtype == "float16" and device_type != "cuda"):
        return "fp32"
    if dtype == "float32":
        return "bf16" if device_type == "cuda" else "fp32"
    precision = "bf16" if dtype == "bfloat16" else "fp16"
    warn_if_emulated_bf16(precision, device_type, fix="FinetuneConfig(bf16=False)")
    return precision


def sentence_embeddings(model, tokenizer, texts: list[str], max_length: int, pooler: Pooler, layer: int,
                        device: torch.device, use_bf16: bool | str,
                        prompt_lengths: torch.Tensor | None = None) -> torch.Tensor:
    """(B, D) float32: what featurize stores for `texts` (prompt + text; `prompt_lengths` (B,) prompt tokens
    left out of the pooling where the model's Pooling says so). `use_bf16`: the autocast, a compute_context
    precision (tuning_precision's), or True for bf16 and False for fp32."""
    precision = use_bf16 if isinstance(use_bf16, str) else "bf16" if use_bf16 else "fp32"
    enc = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    lengths = None if prompt_lengths is None or not prompt_lengths.any() else prompt_lengths.to(device)
    pooled = pooled_forward(model, enc["input_ids"].to(device), enc["attention_mask"].to(device), pooler,
                            (layer,), precision, lengths)[0]  # (B, D) float32
    if pooler.spec.normalize and layer == -1:
        pooled = torch.nn.functional.normalize(pooled, dim=-1)
    return pooled
