"""Continued masked-language-model pre-training ("domain adaptation") of the encoder.

`adapt(config, data_paths, out_dir)` packs unlabeled text into blocks, trains the encoder + MLM
head with AdamW under a linear warm-up/decay schedule, and writes a Hugging Face checkpoint of
the encoder to `out_dir` (plus tokenizer, `mlm_head.safetensors` and `adapt.json`), which
`cli featurize --model out_dir` takes like any other model.

Resuming: `out_dir/checkpoint-last/` (model, optimizer, RNG states, step, losses) is written every
`save_every` steps by writing a temporary folder and renaming it. A rerun with the same config
continues from it; a rerun that changes anything but the run length refuses. The learning rate
is a pure function of (step, total steps), so there is no scheduler state to save: extending
`max_steps` re-plans the decay from the current step.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from headstore.data.files import atomic_write_json
from headstore.featurize.model import pick_device
from headstore.featurize.tuning.mlm_head import head_parameters, load_mlm_model, masked_lm_loss, save_encoder, save_head
from headstore.featurize.tuning.packing import MLMCollator, load_texts, pack_texts, split_holdout, texts_fingerprint
from headstore.heads.schedule import lr_lambda

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint-last"
RUN_LENGTH_FIELDS = ("epochs", "max_steps", "save_every", "device")  # may change on resume
SIDECAR_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


@dataclass(frozen=True)
class AdaptConfig:
    model: str = "minilm"  # name for featurize.model.resolve_model, or a model directory
    max_length: int = 128  # block length; MiniLM was trained at 128-256, and short blocks are cheap
    mlm_probability: float = 0.15  # BERT's masking rate
    whole_word: bool = False  # BERT's original per-piece masking; True masks whole words
    train_encoder: bool = True  # False trains only the head: the honest baseline for a fresh head
    lr: float = 5e-5  # the usual continued-pre-training rate; higher forgets faster
    fresh_head_lr: float = 1e-3  # a newly initialised head's own parameters (not the tied decoder)
    # learn fast: at `lr` it needs thousands of steps, feeding noise to the encoder all along
    warmup_ratio: float = 0.06  # RoBERTa-style short warm-up for AdamW's moment estimates
    weight_decay: float = 0.01  # BERT's; not applied to biases and LayerNorm
    max_grad_norm: float = 1.0  # clipping guards the fresh head's first large gradients
    batch_size: int = 32  # blocks per step; 32 x 128 tokens fits a CPU step in about a second
    epochs: float = 1.0  # passes over the blocks, used when max_steps is None
    max_steps: int | None = None  # fixed step budget (overrides epochs)
    holdout_fraction: float = 0.0  # texts kept out of training for evaluation (by text_id hash)
    seed: int = 0  # data order, masks, dropout and a fresh head
    device: str = "auto"  # "auto" = cuda when available
    bf16: bool = True  # bf16 autocast on CUDA (ignored on CPU, where it is slow)
    save_every: int = 200  # steps between checkpoints

    def __post_init__(self):
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.batch_size < 1 or self.save_every < 1 or self.epochs <= 0:
            raise ValueError("batch_size and save_every must be >= 1 and epochs > 0")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")


def lr_at(step: int, total: int, warmup: int, peak: float) -> float:
    """Linear warm-up to `peak` over `warmup` steps, then linear decay to 0 at `total`: transformers'
    linear schedule (heads.schedule.lr_lambda), the warm-up counting the update being taken."""
    return peak * lr_lambda("linear", warmup, total)(step)


def _device(name: str) -> torch.device:
    return torch.device(pick_device(name))


def _optimizer(model, config: AdaptConfig, fresh_head: bool) -> torch.optim.AdamW:
    """Groups (decay?, fresh head?): no decay for biases and LayerNorm; `fresh_head_lr` for the
    own parameters of a newly initialised head. Each group's `lr_scale` multiplies the schedule."""
    head = {id(p) for p in head_parameters(model).values()} if fresh_head else set()
    groups: dict[tuple[bool, bool], list] = {}
    for name, p in model.named_parameters():  # tied parameters appear once
        if p.requires_grad:
            key = (not (p.dim() < 2 or "LayerNorm" in name), id(p) in head)
            groups.setdefault(key, []).append(p)
    return torch.optim.AdamW(
        [{"params": params, "weight_decay": config.weight_decay if decay else 0.0,
          "lr_scale": config.fresh_head_lr / config.lr if is_head else 1.0}
         for (decay, is_head), params in sorted(groups.items())], lr=config.lr)


def _resume_key(config: AdaptConfig) -> dict:
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in RUN_LENGTH_FIELDS}


def _save_checkpoint(out_dir: Path, model, optimizer, state: dict, mask_gen: torch.Generator):
    from safetensors.torch import save_model

    final, old = out_dir / CHECKPOINT, out_dir / (CHECKPOINT + ".old")
    tmp = out_dir / f"{CHECKPOINT}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    rng = {"torch": torch.get_rng_state(), "mask": mask_gen.get_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def _load_checkpoint(out_dir: Path, model, optimizer, mask_gen, config: AdaptConfig,
                     data_fp: str) -> dict | None:
    from safetensors.torch import load_model

    folder = out_dir / CHECKPOINT
    if not folder.is_dir() and (out_dir / (CHECKPOINT + ".old")).is_dir():
        folder = out_dir / (CHECKPOINT + ".old")  # interrupted between the two renames
    if not folder.is_dir():
        return None
    state = json.loads((folder / "state.json").read_text())
    want, have = _resume_key(config), state["resume_key"]
    if want != have:
        diff = ", ".join(f"{k}: {have.get(k)!r} -> {want.get(k)!r}"
                         for k in sorted(set(want) | set(have)) if want.get(k) != have.get(k))
        raise ValueError(f"{folder} was written with a different config ({diff}); use another "
                         "output folder, or delete it to start over")
    if state["data_fingerprint"] != data_fp:
        raise ValueError(f"{folder} was trained on different text ({state['data_paths']}); use "
                         "another output folder, or delete it to start over")
    load_model(model, str(folder / "model.safetensors"))
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=True))
    rng = torch.load(folder / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    mask_gen.set_state(rng["mask"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return state


def _loss_curve(losses: list[float], window: int = 10) -> list[dict]:
    return [{"step": i + min(window, len(losses) - i), "loss": sum(losses[i:i + window]) /
             len(losses[i:i + window])} for i in range(0, len(losses), window)]


def adapt(config: AdaptConfig, data_paths: list[str | Path], out_dir: str | Path, *,
          column: str = "text", stop_after_steps: int | None = None) -> dict:
    """Run (or resume) MLM adaptation; return the summary also written to `out_dir/adapt.json`.

    `stop_after_steps` ends this call after that many steps with a checkpoint, as an interruption
    would (the next call resumes); the final model is written only when the run completes.
    """
    from headstore.featurize.model import resolve_model
    from transformers import AutoTokenizer

    if not data_paths:
        raise ValueError("adapt needs at least one text file or corpus folder")
    model_dir = Path(resolve_model(config.model))
    out_dir = Path(out_dir)
    if model_dir.exists() and out_dir.resolve() == model_dir.resolve():
        raise ValueError(f"{out_dir}: the output folder is the model's own folder")
    out_dir.mkdir(parents=True, exist_ok=True)

    texts = [t for path in data_paths for t in load_texts(path, column=column)]
    train_texts, held_out = split_holdout(texts, config.holdout_fraction)
    if not train_texts:
        raise ValueError(f"{', '.join(map(str, data_paths))}: no text to train on")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    blocks = pack_texts(train_texts, tokenizer, config.max_length)
    data_fp = texts_fingerprint(train_texts)

    device = _device(config.device)
    model, head_status = load_mlm_model(model_dir, seed=config.seed)
    if head_status == "initialised":
        log.warning("!!! %s has no MLM head: training a freshly initialised head (decoder tied to "
                    "the input embeddings); its early losses measure the head, not the encoder",
                    config.model)
    if not config.train_encoder:
        for p in model.base_model.parameters():
            p.requires_grad_(False)  # also freezes the tied decoder (it is the embedding matrix)
    model.to(device).train()
    optimizer = _optimizer(model, config, fresh_head=head_status == "initialised")
    collator = MLMCollator(tokenizer, model.config.vocab_size, config.mlm_probability,
                           config.whole_word)
    torch.manual_seed(config.seed)  # dropout
    mask_gen = torch.Generator().manual_seed(config.seed + 1)

    steps_per_epoch = math.ceil(len(blocks) / config.batch_size)
    total = config.max_steps or max(1, math.ceil(config.epochs * steps_per_epoch))
    warmup = math.ceil(config.warmup_ratio * total)
    state = _load_checkpoint(out_dir, model, optimizer, mask_gen, config, data_fp)
    step, losses = (state["step"], state["losses"]) if state else (0, [])
    resumed_from = step
    if state:
        log.info("resuming %s from step %d of %d", out_dir / CHECKPOINT, step, total)
    end = total if stop_after_steps is None else min(total, step + stop_after_steps)
    use_bf16 = config.bf16 and device.type == "cuda"

    def checkpoint():
        _save_checkpoint(out_dir, model, optimizer, {
            "step": step, "total_steps": total, "losses": losses, "resume_key": _resume_key(config),
            "data_fingerprint": data_fp, "data_paths": [str(p) for p in data_paths],
            "head_status": head_status}, mask_gen)

    started, order, order_epoch = time.time(), None, -1
    bar = tqdm(total=total, initial=step, desc="adapt", unit="step")
    try:
        while step < end:
            epoch, position = divmod(step, steps_per_epoch)
            if epoch != order_epoch:  # the data order of an epoch depends only on (seed, epoch)
                order = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(
                    config.seed * 100_003 + epoch)).tolist()
                order_epoch = epoch
            picked = order[position * config.batch_size:(position + 1) * config.batch_size]
            batch = collator([blocks[i] for i in picked], mask_gen)
            for group in optimizer.param_groups:
                group["lr"] = group["lr_scale"] * lr_at(step, total, warmup, config.lr)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                loss = masked_lm_loss(model, batch.input_ids.to(device),
                                      batch.attention_mask.to(device), batch.labels.to(device))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(
                [p for p in model.parameters() if p.requires_grad], config.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{lr_at(step - 1, total, warmup, config.lr):.1e}")
            if step % config.save_every == 0 and step < end:
                checkpoint()
    except KeyboardInterrupt:
        checkpoint()
        log.warning("interrupted at step %d; rerun the same command to resume", step)
        raise
    finally:
        bar.close()
    checkpoint()
    finished = step >= total
    summary = {
        "config": dataclasses.asdict(config), "model_dir": str(model_dir),
        "data_paths": [str(p) for p in data_paths], "n_texts": len(texts),
        "n_train_texts": len(train_texts), "n_held_out_texts": len(held_out),
        "n_blocks": len(blocks), "n_tokens": sum(len(b) for b in blocks),
        "data_fingerprint": data_fp, "steps": step, "total_steps": total,
        "resumed_from_step": resumed_from,
        "warmup_steps": warmup, "finished": finished, "device": str(device),
        "mlm_head": head_status, "mlm_head_newly_initialised": head_status == "initialised",
        "seconds_this_call": round(time.time() - started, 1),
        "first_loss": losses[0] if losses else None,
        "last_loss_mean10": sum(losses[-10:]) / len(losses[-10:]) if losses else None,
        "losses": _loss_curve(losses),
    }
    if finished:
        _write_output(model, tokenizer, model_dir, out_dir, config.seed, summary)
    return summary


def _write_output(model, tokenizer, model_dir: Path, out_dir: Path, seed: int, summary: dict):
    model.to("cpu").eval()
    save_encoder(model, model_dir, out_dir, seed=seed)
    save_head(model, out_dir)
    tokenizer.save_pretrained(str(out_dir))
    for name in SIDECAR_FILES:  # keep the folder usable as a sentence-transformers model
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out_dir / name)
    for sub in sorted(model_dir.glob("1_Pooling")):
        shutil.copytree(sub, out_dir / sub.name, dirs_exist_ok=True)
    atomic_write_json(out_dir / "adapt.json", summary, indent=1)
    log.info("adapted encoder written to %s", out_dir)
