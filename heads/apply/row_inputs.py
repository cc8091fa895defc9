"""What featurize gave the encoder for each store row: its text under the prompt of the role it was stored in.

A store made with prompts (E5/BGE-style models, `cli featurize --query-prompt`) holds each text once per role,
encoded as prompt + text, and a model whose Pooling leaves the prompt out (`include_prompt: false`) pools
without the prompt's tokens (featurize.run.encode_in_plan_order). Fine-tuning re-encodes store rows with the
encoder it trains, so it must give the encoder the same inputs: the row's prompt is found from the row id
itself (`row_id(text, prompt)`, data.text_id), one of the store's role prompts (its manifest's `prompts`),
and its length counted as featurize counts it (featurize.encode.prompt_length).
"""
from __future__ import annotations

import torch

from headstore.data.text_id import row_id
from headstore.featurize.encode import prompt_length
from headstore.featurize.store import StoreError


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
