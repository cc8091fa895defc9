"""How well an encoder + MLM head predicts masked tokens: to see adaptation gain and forgetting.

- `mlm_loss`: mean cross-entropy over the masked positions of packed blocks, under masks drawn
  from a fixed seed, so two models with the same tokenizer are scored on exactly the same masks.
- `pseudo_perplexity`: mask each token of a text in turn (one copy per token, batched) and
  exponentiate the mean negative log-probability of the true tokens (Salazar et al., 2020).

What the numbers mean depends on the head, reported as `mlm_head`:
- "pretrained" / "adapted": a head trained with this encoder; the numbers measure the pair.
- "initialised": the checkpoint has no MLM head (e.g. all-MiniLM-L6-v2); a fresh random head
  (seeded, decoder tied to the embeddings) is scored. Its loss is near that of guessing and says
  nothing about the encoder. Comparing it with an adapted model's loss mixes "the head learned to
  decode" with "the encoder changed". The honest baseline for a headless model is a head trained
  on top of the *frozen* encoder for the same steps (`AdaptConfig(train_encoder=False)`): then
  adapted-vs-baseline isolates what changing the encoder did, in-domain (gain) and on general
  text (forgetting).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from headstore.data.progress import progress_bar
from headstore.featurize.tuning.mlm_head import load_mlm_model, masked_lm_loss
from headstore.featurize.tuning.packing import IGNORE_INDEX, MLMCollator, pack_texts

HEAD_NOTES = {
    "pretrained": "MLM head from the checkpoint",
    "adapted": "MLM head trained by cli adapt (mlm_head.safetensors)",
    "initialised": "no MLM head in the checkpoint: a freshly initialised random head was scored; "
                   "the number describes that head, not the encoder (compare with a head-only "
                   "baseline, AdaptConfig(train_encoder=False))",
}


def _load(model_path: str | Path, head_seed: int, device: str):
    from headstore.featurize.encoder.adapters import attach_saved, has_adapters
    from headstore.featurize.encoder.model import resolve_model
    from transformers import AutoTokenizer

    model_dir = Path(resolve_model(str(model_path)))
    model, head_status = load_mlm_model(model_dir, seed=head_seed)
    if has_adapters(model_dir):  # an encoder of `cli finetune --setup adapters`: scored with its adapters
        attach_saved(model, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return model.to(device).eval(), tokenizer, head_status


@torch.no_grad()
def mlm_loss(model_path: str | Path, texts: list[str], max_length: int = 128, seed: int = 0,
             n_masks: int = 3, batch_size: int = 32, mlm_probability: float = 0.15,
             head_seed: int = 0, device: str = "cpu", progress: bool = True) -> dict:
    """Mean MLM loss (token-weighted) over `n_masks` seeded maskings of the packed texts."""
    if n_masks < 1:
        raise ValueError(f"n_masks must be >= 1, got {n_masks}")
    model, tokenizer, head_status = _load(model_path, head_seed, device)
    blocks = pack_texts(texts, tokenizer, max_length)
    if not blocks:
        raise ValueError("mlm_loss got no text")
    total, count = 0.0, 0
    steps = n_masks * math.ceil(len(blocks) / batch_size)
    bar = progress_bar(total=steps, desc="mlm loss", disable=not progress, leave=False)
    for round_ in range(n_masks):
        collate = MLMCollator(tokenizer, model.config.vocab_size, mlm_probability, whole_word=False,
                              seed=seed * 1_000_003 + round_)
        for start in range(0, len(blocks), batch_size):
            batch = {k: v.to(device) for k, v in collate(blocks[start:start + batch_size]).items()}
            labels = batch["labels"]
            total += float(masked_lm_loss(model, batch["input_ids"], batch["attention_mask"], labels, "sum"))
            count += int((labels != IGNORE_INDEX).sum())
            bar.update(1)
    bar.close()
    return {"mlm_loss": total / count, "n_predicted": count, "n_blocks": len(blocks),
            "n_texts": len(texts), "n_masks": n_masks, "seed": seed, "max_length": max_length,
            "mlm_head": head_status, "note": HEAD_NOTES[head_status]}


@torch.no_grad()
def pseudo_perplexity(model_path: str | Path, texts: list[str], max_texts: int = 50,
                      max_length: int = 128, batch_size: int = 128, head_seed: int = 0,
                      device: str = "cpu", progress: bool = True) -> dict:
    """exp(mean over tokens of -log p(token | text with that token masked)).

    Only the first `max_texts` texts are scored, each truncated to `max_length` tokens: one
    forward pass per token is expensive (50 texts x 128 tokens take about a minute for MiniLM on
    2 CPU cores).
    """
    model, tokenizer, head_status = _load(model_path, head_seed, device)
    chosen = [t for t in texts if t.strip()][:max_texts]
    if not chosen:
        raise ValueError("pseudo_perplexity got no text")
    specials = torch.tensor(sorted(set(tokenizer.all_special_ids)))
    total_nll, n_tokens = 0.0, 0
    for text in progress_bar(chosen, desc="pseudo-perplexity", disable=not progress, leave=False):
        ids = tokenizer(text, truncation=True, max_length=max_length,
                        return_tensors="pt")["input_ids"][0]  # (T,)
        positions = (~torch.isin(ids, specials)).nonzero().squeeze(1)  # (P,)
        for start in range(0, len(positions), batch_size):
            pos = positions[start:start + batch_size]  # (b,)
            copies = ids.repeat(len(pos), 1)  # (b, T)
            copies[torch.arange(len(pos)), pos] = tokenizer.mask_token_id
            logits = model(input_ids=copies.to(device)).logits  # (b, T, V)
            picked = logits[torch.arange(len(pos)), pos.to(device)].float()  # (b, V)
            logp = picked.log_softmax(-1).gather(1, ids[pos].to(device)[:, None])  # (b, 1)
            total_nll -= float(logp.sum())
            n_tokens += len(pos)
    return {"pseudo_perplexity": math.exp(total_nll / n_tokens), "mean_nll": total_nll / n_tokens,
            "n_tokens": n_tokens, "n_texts": len(chosen), "max_length": max_length,
            "mlm_head": head_status, "note": HEAD_NOTES[head_status]}
