"""Continued masked-language-model pre-training ("domain adaptation") of the encoder.

`adapt(config, data_paths, out_dir)` packs unlabeled text into blocks, trains the encoder + MLM
head with AdamW under a linear warm-up/decay schedule, and writes a Hugging Face checkpoint of
the encoder to `out_dir` (plus tokenizer, `mlm_head.safetensors` and `adapt.json`), which
`cli featurize --model out_dir` takes like any other model.

Resuming: `out_dir/checkpoint-last/` (model, optimizer, RNG states, step, losses) is written every
`save_every` steps by writing a temporary folder and renaming it. A rerun with the same config
continues from it; a rerun that changes anything but the run length refuses (the key: every setting's resolved
value, the starting model's contents and the adapt recipe version; a checkpoint of an older headstore, without a
recipe version, is refused in one line). The learning rate
is a pure function of (step, total steps), so there is no scheduler state to save: extending
`max_steps` re-plans the decay from the current step.

Until settled (`until_settled`): the rate warms up over `warmup_ratio` of the first `settle_check` steps and
then stays constant, and every `settle_check` steps the loss curve is judged by featurize.tuning.settle; the
run stops at the first check that says settled, else at `max_steps` (the cap), and the summary says which
(`stopped`: "settled" | "cap"). Neither the rate nor the checks depend on the cap, so a capped run resumed
with a higher cap continues exactly as a run with that cap from the start.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from headstore.data.progress import progress_bar
from headstore.data.files import atomic_write_json
from headstore.data.keys import content_digest, recipe, resolved
from headstore.featurize.encoder.config import AdaptConfig
from headstore.featurize.encoder.model import pick_device, resolve_model
from headstore.featurize.tuning.checkpoint import checkpoint_state, copy_sidecars, read_checkpoint, write_checkpoint
from headstore.featurize.tuning.mlm_head import head_parameters, load_mlm_model, masked_lm_loss, save_encoder, save_head
from headstore.featurize.tuning.packing import MLMCollator, load_texts, pack_texts, split_holdout, texts_fingerprint
from headstore.featurize.tuning.schedule import lr_lambda
from headstore.featurize.tuning.settle import settled

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint-last"
RUN_LENGTH_FIELDS = ("epochs", "max_steps", "save_every", "device")  # may change on resume


def lr_at(step: int, total: int, warmup: int, peak: float) -> float:
    """Linear warm-up to `peak` over `warmup` steps, then linear decay to 0 at `total`: transformers'
    linear schedule (heads.schedule.lr_lambda), the warm-up counting the update being taken."""
    return peak * lr_lambda("linear", warmup, total)(step)


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


@dataclass
class AdaptData:
    """The text of a run: how many texts were read and held out, the packed train blocks, their fingerprint."""

    paths: list[str]
    n_texts: int
    n_train_texts: int
    n_held_out_texts: int
    blocks: list[dict]  # pack_texts blocks (with character offsets under whole-word masking)
    fingerprint: str  # of the train texts: a resumed run must train on the same data


def load_data(config: AdaptConfig, data_paths: list[str | Path], tokenizer, column: str = "text") -> AdaptData:
    """Read every path, hold out `holdout_fraction` of the texts, pack the rest into blocks."""
    if not data_paths:
        raise ValueError("adapt needs at least one text file or corpus folder")
    texts = [t for path in data_paths for t in load_texts(path, column=column)]
    train, held_out = split_holdout(texts, config.holdout_fraction)
    if not train:
        raise ValueError(f"{', '.join(map(str, data_paths))}: no text to train on")
    blocks = pack_texts(train, tokenizer, config.max_length, offsets=config.whole_word)
    return AdaptData([str(p) for p in data_paths], len(texts), len(train), len(held_out), blocks,
                     texts_fingerprint(train))


@dataclass
class _Run:
    """One call's training state: what the loop moves forward and a checkpoint saves."""

    config: AdaptConfig
    model: Any  # AutoModelForMaskedLM
    head_status: str  # mlm_head.HEAD_STATUSES
    optimizer: torch.optim.AdamW
    collator: MLMCollator  # its generator draws the masks
    blocks: list[dict]
    device: torch.device
    total: int  # steps of the whole run
    warmup: int
    step: int = 0
    losses: list[float] = field(default_factory=list)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.blocks) / self.config.batch_size)

    def lr(self, step: int) -> float:
        """The rate of update `step`: linear decay to `total`, or constant after warm-up until settled."""
        if self.config.until_settled:
            return self.config.lr * lr_lambda("constant", self.warmup, self.total)(step)
        return lr_at(step, self.total, self.warmup, self.config.lr)

    def settled_now(self) -> bool:
        """Until settled: this step is a check and the loss has settled (a resumed run re-judges its last check)."""
        cfg = self.config
        return (cfg.until_settled and self.step > 0 and self.step % cfg.settle_check == 0
                and settled(_loss_curve(self.losses))[0])

    @property
    def stopped(self) -> str | None:
        """Why the run ended: "settled" (a check said so), "cap" (max_steps / epochs), None (not yet)."""
        return "settled" if self.settled_now() else "cap" if self.step >= self.total else None


def _output_dir(model_dir: Path, out_dir: str | Path) -> Path:
    """The output folder, created; never the model's own folder."""
    out_dir = Path(out_dir)
    if model_dir.exists() and out_dir.resolve() == model_dir.resolve():
        raise ValueError(f"{out_dir}: the output folder is the model's own folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def _load_model(config: AdaptConfig, model_dir: Path, device: torch.device) -> tuple[Any, str]:
    """The MLM model on `device` in train mode (encoder frozen unless `train_encoder`), and its head status."""
    model, head_status = load_mlm_model(model_dir, seed=config.seed)
    if head_status == "initialised":
        log.warning("!!! %s has no MLM head: training a freshly initialised head (decoder tied to "
                    "the input embeddings); its early losses measure the head, not the encoder",
                    config.model)
    if not config.train_encoder:
        for p in model.base_model.parameters():
            p.requires_grad_(False)  # also freezes the tied decoder (it is the embedding matrix)
    return model.to(device).train(), head_status


def _start(config: AdaptConfig, model_dir: Path, data: AdaptData, tokenizer) -> _Run:
    device = torch.device(pick_device(config.device))
    model, head_status = _load_model(config, model_dir, device)
    total = config.max_steps or max(1, math.ceil(config.epochs * math.ceil(len(data.blocks) / config.batch_size)))
    planned = config.settle_check if config.until_settled else total  # what the warm-up is a share of
    run = _Run(config, model, head_status, _optimizer(model, config, fresh_head=head_status == "initialised"),
               MLMCollator(tokenizer, model.config.vocab_size, config.mlm_probability, config.whole_word,
                           seed=config.seed + 1),
               data.blocks, device, total, warmup=math.ceil(config.warmup_ratio * planned))
    torch.manual_seed(config.seed)  # dropout
    return run


def _resume_key(config: AdaptConfig) -> dict:
    """What a checkpoint belongs to (data/keys.py's rule): every setting's resolved value but the run length, the
    starting model's files by their contents (a local folder; a Hub id by its name) and the adapt recipe version."""
    key = {k: v for k, v in resolved(config).items() if k not in RUN_LENGTH_FIELDS}
    where = resolve_model(config.model)
    if Path(where).is_dir():
        key["model"] = {"weights": content_digest(where, "--model")}
    return {**key, "recipe": recipe("adapt")}


def _resume(run: _Run, out_dir: Path, data: AdaptData) -> None:
    """Continue from `out_dir/checkpoint-last` if there is one; refuse one of another config or text."""
    found = checkpoint_state(out_dir / CHECKPOINT)
    if found is None:
        return
    folder, state = found
    want, have = _resume_key(run.config), state["resume_key"]
    if "recipe" not in have:
        raise ValueError(f"{folder} was written by an older headstore (its key holds no recipe version, so what made "
                         "it cannot be told); delete it to start over, or use another output folder")
    if want != have:
        diff = ", ".join(f"{k}: {have.get(k)!r} -> {want.get(k)!r}"
                         for k in sorted(set(want) | set(have)) if want.get(k) != have.get(k))
        raise ValueError(f"{folder} was written with a different config ({diff}); use another "
                         "output folder, or delete it to start over")
    if state["data_fingerprint"] != data.fingerprint:
        raise ValueError(f"{folder} was trained on different text ({state['data_paths']}); use "
                         "another output folder, or delete it to start over")
    read_checkpoint(folder, run.model, run.optimizer, run.collator.generator)
    run.step, run.losses = state["step"], state["losses"]
    log.info("resuming %s from step %d of %d", folder, run.step, run.total)


def _checkpoint(run: _Run, out_dir: Path, data: AdaptData) -> None:
    write_checkpoint(out_dir / CHECKPOINT, run.model, run.optimizer, {
        "step": run.step, "total_steps": run.total, "losses": run.losses, "resume_key": _resume_key(run.config),
        "data_fingerprint": data.fingerprint, "data_paths": data.paths, "head_status": run.head_status},
        run.collator.generator)


@lru_cache(maxsize=1)
def _epoch_order(seed: int, epoch: int, n_blocks: int) -> tuple[int, ...]:
    """The order of the blocks in an epoch: a function of (seed, epoch) only, so a resumed run agrees."""
    return tuple(torch.randperm(n_blocks, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist())


def _next_blocks(run: _Run) -> list[dict]:
    epoch, position = divmod(run.step, run.steps_per_epoch)
    order, size = _epoch_order(run.config.seed, epoch, len(run.blocks)), run.config.batch_size
    return [run.blocks[i] for i in order[position * size:(position + 1) * size]]


def _autocast_bf16(cfg: AdaptConfig, device: torch.device) -> bool:
    """bf16 autocast (fp32 master weights) on CUDA and on a CPU that runs bf16 natively (AVX-512-BF16, AMX:
    MiniLM's forward + backward ran ~2x fp32's tokens/s on a 2-core Zen 4); never where it is emulated."""
    from headstore.featurize.encoder.hardware import native_bf16

    return cfg.bf16 and (device.type == "cuda" or (device.type == "cpu" and native_bf16()))


def _train_step(run: _Run, blocks: list[dict]) -> None:
    """One update on `blocks` (freshly masked) at the scheduled rate."""
    cfg = run.config
    batch = {k: v.to(run.device) for k, v in run.collator(blocks).items()}
    for group in run.optimizer.param_groups:
        group["lr"] = group["lr_scale"] * run.lr(run.step)
    with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=_autocast_bf16(cfg, run.device)):
        loss = masked_lm_loss(run.model, batch["input_ids"], batch["attention_mask"], batch["labels"])
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in run.model.parameters() if p.requires_grad], cfg.max_grad_norm)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.losses.append(float(loss.detach()))
    run.step += 1


def _train(run: _Run, end: int, checkpoint) -> None:
    """Steps up to `end` (or to a check that says settled): a checkpoint every `save_every` steps, and on
    Ctrl-C before it stops."""
    bar = progress_bar(total=run.total, initial=run.step, desc="adapt", unit="step")
    try:
        while run.step < end and not run.settled_now():
            _train_step(run, _next_blocks(run))
            bar.update(1)
            bar.set_postfix(loss=f"{run.losses[-1]:.3f}", lr=f"{run.lr(run.step - 1):.1e}")
            if run.step % run.config.save_every == 0 and run.step < end:
                checkpoint()
    except KeyboardInterrupt:
        checkpoint()
        log.warning("interrupted at step %d; rerun the same command to resume", run.step)
        raise
    finally:
        bar.close()


def _loss_curve(losses: list[float], window: int = 10) -> list[dict]:
    return [{"step": i + min(window, len(losses) - i), "loss": sum(losses[i:i + window]) /
             len(losses[i:i + window])} for i in range(0, len(losses), window)]


def _summary(run: _Run, data: AdaptData, model_dir: Path, resumed_from: int, seconds: float) -> dict:
    losses = run.losses
    return {
        "config": dataclasses.asdict(run.config), "model_dir": str(model_dir),
        "data_paths": data.paths, "n_texts": data.n_texts,
        "n_train_texts": data.n_train_texts, "n_held_out_texts": data.n_held_out_texts,
        "n_blocks": len(data.blocks), "n_tokens": sum(len(b["input_ids"]) for b in data.blocks),
        "data_fingerprint": data.fingerprint, "steps": run.step, "total_steps": run.total,
        "resumed_from_step": resumed_from,
        "warmup_steps": run.warmup, "finished": run.stopped is not None, "stopped": run.stopped,
        "capped": run.stopped == "cap", "settled": settled(_loss_curve(losses))[0], "device": str(run.device),
        "mlm_head": run.head_status, "mlm_head_newly_initialised": run.head_status == "initialised",
        "seconds_this_call": round(seconds, 1),
        "first_loss": losses[0] if losses else None,
        "last_loss_mean10": sum(losses[-10:]) / len(losses[-10:]) if losses else None,
        "losses": _loss_curve(losses),
    }


def adapt(config: AdaptConfig, data_paths: list[str | Path], out_dir: str | Path, *,
          column: str = "text", stop_after_steps: int | None = None) -> dict:
    """Run (or resume) MLM adaptation; return the summary also written to `out_dir/adapt.json`.

    `stop_after_steps` ends this call after that many steps with a checkpoint, as an interruption
    would (the next call resumes); the final model is written only when the run completes.
    """
    from headstore.featurize.encoder.model import resolve_model
    from transformers import AutoTokenizer

    model_dir = Path(resolve_model(config.model))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    data = load_data(config, data_paths, tokenizer, column)  # bad input is refused before anything is written
    out_dir = _output_dir(model_dir, out_dir)
    run = _start(config, model_dir, data, tokenizer)
    _resume(run, out_dir, data)
    resumed_from, started = run.step, time.time()
    end = run.total if stop_after_steps is None else min(run.total, run.step + stop_after_steps)
    _train(run, end, lambda: _checkpoint(run, out_dir, data))
    _checkpoint(run, out_dir, data)
    summary = _summary(run, data, model_dir, resumed_from, time.time() - started)
    if summary["finished"]:
        _write_output(run.model, tokenizer, model_dir, out_dir, config.seed, summary)
    return summary


def _write_output(model, tokenizer, model_dir: Path, out_dir: Path, seed: int, summary: dict):
    model.to("cpu").eval()
    save_encoder(model, model_dir, out_dir, seed=seed)
    save_head(model, out_dir)
    tokenizer.save_pretrained(str(out_dir))
    copy_sidecars(model_dir, out_dir)  # keep the folder usable as a sentence-transformers model
    atomic_write_json(out_dir / "adapt.json", summary, indent=1)
    log.info("adapted encoder written to %s", out_dir)
