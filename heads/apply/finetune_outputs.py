"""What `cli finetune` writes (heads.apply.finetune's module doc): the trained encoder, a head directory whose
config names the new encoder's fingerprint parts, and finetune.json with the commands that featurize and
evaluate with it."""
from __future__ import annotations

import shlex
from dataclasses import asdict
from pathlib import Path

import numpy as np

from headstore.data.files import atomic_write_json
from headstore.featurize.encoder.model import model_identity
from headstore.featurize.store.layout import fingerprint_of
from headstore.featurize.tuning.checkpoint import copy_sidecars
from headstore.featurize.tuning.mlm_head import HEAD_FILE
from headstore.heads.artefacts.files import write_head_dir
from headstore.heads.artefacts.judged import write_judgements
from headstore.heads.kinds import judgement_pairs


def _featurize_options(parts: dict) -> str:
    """The featurize options that give a new store this one's dtype, numerics and prompts (its fingerprint holds
    them)."""
    prompts = parts.get("prompts") or {}
    options = [f"--dtype {parts['dtype']}"] if parts.get("dtype") else []
    precision = parts.get("numerics") if parts.get("numerics") == "bf16-weights" else parts.get("precision")
    options += [f"--precision {precision}"] if precision and precision != "fp32" else []
    options += [f"--{role}-prompt {shlex.quote(prompts.get(role, ''))}" for role in ("query", "document") if prompts]
    return "".join(" " + o for o in options)


def _judgements(new_head: Path, run, earlier) -> dict:
    """The tuned head's record (heads.artefacts.judged): its source head's judgements (`earlier`, None: it keeps
    none) and the tuning run's own (train, and dev, which chose the kept epoch), so `cli eval` of it splits its
    figures into seen and unseen."""
    return write_judgements(new_head, run.src.store, judgement_pairs(run.src.task), earlier)


def write_outputs(out: Path, run, head_dir, cfg, report: dict, seconds: float, earlier=None) -> dict:
    """out/encoder (the trained encoder), out/head (the head, its config naming the new encoder's fingerprint
    parts, and its judgements: `earlier`, the source head's record, with the run's own) and out/finetune.json; `run`
    is a finetune.Prepared, `cfg` its FinetuneConfig. Returns the summary."""
    model, tokenizer, model_dir, tuning, parts = run.model, run.tokenizer, run.model_dir, run.tuning, run.src.parts
    head, norm, head_config, trainer = run.head, run.norm, run.head_config, run.trainer
    enc_dir, new_head, history = out / "encoder", out / "head", trainer.history
    counts = {"trainable_params": sum(p.numel() for b in trainer.blocks for _, p in b),  # before a LoRA merge
              "encoder_params": sum(p.numel() for p in model.parameters())}
    enc_dir.mkdir(parents=True, exist_ok=True)
    if cfg.gradient_checkpointing:  # transformers 5 renamed the disable call
        (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()
    tuning.save(model.to("cpu").eval(), enc_dir, model_dir)
    tokenizer.save_pretrained(str(enc_dir))
    copy_sidecars(model_dir, enc_dir, extra=(HEAD_FILE,))  # max_seq_length, the ST layout, an adapted MLM head
    identity = model_identity(str(enc_dir), parts["max_length"])
    new_parts = {**{k: v for k, v in parts.items() if k not in ("arrays", "dim", "n_texts", "fingerprint")},
                 "model_id": identity.model_id, "weights_hash": identity.weights_hash,
                 "tokenizer_hash": identity.tokenizer_hash}
    fingerprint = fingerprint_of(new_parts)
    head = head.to("cpu").eval()
    norm.center, norm.scale = norm.center.cpu(), norm.scale.cpu()
    summary = {"config": asdict(cfg), "setup": cfg.setup, "setup_settings": tuning.describe(),
               "encoder_lr": cfg.peak_encoder_lr, **counts, "source_head": str(head_dir),
               "source_encoder": str(model_dir),
               "encoder_dir": str(enc_dir), "head_dir": str(new_head), "n_pairs": len(run.src.pairs), **report,
               "n_blocks": len(trainer.blocks),
               "unfrozen_at_step": {str(k): v for k, v in trainer.unfrozen_at.items()},
               "first_loss": history[0]["loss"], "last_loss_mean10": float(np.mean([h["loss"] for h in history[-10:]])),
               "seconds": round(seconds, 1), "fingerprint": fingerprint, "history": history,
               "next": [f"cli featurize --model {enc_dir} --data {head_config['data']}{_featurize_options(parts)} "
                        "--store STORE2",
                        f"cli eval --store STORE2 --head {new_head} --data {head_config['data']} --out EVAL"]}
    config = {**head_config, "store": None, "store_fingerprint": fingerprint, "encoder_dir": str(enc_dir),
              "store_manifest": {**head_config.get("store_manifest", {}), **new_parts, "fingerprint": fingerprint},
              "finetune": {k: v for k, v in summary.items() if k != "history"}}
    new_head.mkdir(parents=True, exist_ok=True)
    write_head_dir(new_head, head, norm, {**config, "judged": _judgements(new_head, run, earlier)})
    atomic_write_json(out / "finetune.json", summary, indent=1)
    return summary
