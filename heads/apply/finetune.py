"""`cli finetune`: unfreeze the encoder under a trained head and train both end to end for one epoch.

Starts from a `cli train-head --out` directory: the head, its Normalizer and its config (training
settings, dataset, the store it was trained on). The encoder named in that store's manifest is loaded,
the train pairs' texts are tokenised on the fly (`store.texts` maps row -> text), pooled as the store
pooled them, passed through the saved Normalizer and the head, and trained with the head's own loss
(`heads.scoring.losses`, the same in-batch `same` mask and label handling as `heads.training.train`).

Which encoder blocks train (`unfreeze`): "all"; "top-k" (the top `top_k` transformer layers; the
embeddings count as the block below layer 0); "gradual" (the top block from step 0, one more block
every `unfreeze_interval` steps, top-down). Block b's learning rate is
`encoder_lr * layer_lr_decay ** depth(b)`, depth 0 = the top layer, `num_layers` = the embeddings.

What trains in a block (`setup`, the registry heads.apply.tunings.TUNINGS): "full" every weight of it;
"adapters" the bottleneck adapters added to its layer (the base frozen); "lora" the LoRA matrices on its
layer's query/value projections (the base frozen). Adapters and LoRA have no embeddings block.

Output `out_dir`:
- `encoder/`: HF checkpoint (safetensors) + tokenizer + sentence-transformers sidecars: `--model` for
  `cli featurize` (setup "adapters": the base weights unchanged + the adapters; "lora": merged weights);
- `head/`: a train-head-style directory whose config names the new encoder's fingerprint parts, so
  `cli eval --store S2 --head out/head` accepts a store featurized with `encoder/`;
- `finetune.json`: settings, losses, seconds, the commands that re-featurize and evaluate.
"""
from __future__ import annotations

import math
import shlex
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from headstore.data.errors import SettingError
from headstore.data.progress import progress_bar
from headstore.data.files import atomic_write_json
from headstore.featurize.adapters import has_adapters
from headstore.featurize.architectures import layer_blocks
from headstore.featurize.model import model_identity, pick_device, resolve_model
from headstore.featurize.pooling import Pooler
from headstore.featurize.sentence import SentenceSpec
from headstore.featurize.store import FeatureStore, fingerprint_of
from headstore.featurize.tuning.checkpoint import copy_sidecars
from headstore.featurize.tuning.mlm_head import HEAD_FILE
from headstore.heads.apply.row_inputs import RowInputs, sentence_embeddings, tuning_precision
from headstore.heads.apply.tunings import TUNINGS
from headstore.heads.artefacts.files import write_head_dir
from headstore.heads.training.batches import same_mask
from headstore.heads.settings.config import TrainConfig
from headstore.heads.network.features import load_features
from headstore.heads.kinds import kind_of, load_task
from headstore.heads.scoring.losses import LOSSES, get_loss
from headstore.heads.evaluation.mining import mine_negatives
from headstore.heads.training.optim import lr_factor
from headstore.heads.training.run import load_head

UNFREEZE_MODES = ("all", "top-k", "gradual")


@dataclass(frozen=True)
class FinetuneConfig:
    setup: str = "full"  # what trains in the encoder: a TUNINGS name (full | adapters | lora)
    # adapters: bottleneck width m (Linear(d, m) -> ReLU -> Linear(m, d)); 64 is the middle of Houlsby et al.'s
    # {8, 64, 256} and their usual pick: ~2 x 2 x d x 64 weights a layer (~3% of MiniLM's 22.7M parameters)
    adapter_size: int = 64
    lora_rank: int = 8  # LoRA rank r: Hu et al. 2021 found r = 8 on W_q, W_v as good as far larger ranks
    lora_alpha: int = 16  # the update is scaled by alpha / r = 2 (PEFT's common pairing; the lr is what is tuned)
    unfreeze: str = "all"  # all | top-k | gradual (see module doc)
    top_k: int = 2  # top-k: transformer layers trained (MiniLM has 6); > layers also trains embeddings
    unfreeze_interval: int = 10  # gradual: steps between unfreezing one more block (SciFact: ~13 steps/epoch)
    # None -> the setup's own (TUNINGS[setup].default_lr): full 2e-5, the usual BERT fine-tuning rate (the
    # head's 1e-3 would wreck pre-training); adapters 1e-3 and lora 5e-4, which start at the identity
    encoder_lr: float | None = None
    head_lr: float | None = None  # None -> the head's own training lr (it keeps learning at its pace)
    layer_lr_decay: float = 1.0  # discriminative lrs: x decay per block below the top (0.8 is common)
    weight_decay: float = 0.01  # AdamW's decoupled decay on matrices (not biases / LayerNorm)
    warmup_ratio: float = 0.1  # warm-up protects the encoder from the first, noisy head gradients
    grad_clip: float = 1.0  # global gradient-norm clip over encoder + head
    batch_size: int | None = None  # None -> the head's batch size (same in-batch impostors)
    # mined hard negatives per pair while fine-tuning; None -> the head's mined_k. Each one is another
    # sequence through the encoder with gradients: 8 per pair made one SciFact epoch need ~22 GB and
    # ~25 min on a 2-core CPU (measured: killed for memory), so compare.toml sets 0 on CPU
    mined_k: int | None = None
    max_steps: int | None = None  # cap on the steps of the one epoch (None = the whole epoch)
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, ~30% slower
    device: str = "auto"  # auto = cuda when available
    bf16: bool = True  # bf16 autocast on CUDA (ignored on CPU)
    seed: int = 0  # batch order and dropout

    def __post_init__(self):
        if self.setup not in TUNINGS:
            raise ValueError(f"setup={self.setup!r}; valid: {sorted(TUNINGS)}")
        if self.unfreeze not in UNFREEZE_MODES:
            raise ValueError(f"unfreeze={self.unfreeze!r}; valid: {list(UNFREEZE_MODES)}")
        # head_lr, batch_size, max_steps: None takes the head's own / the whole epoch
        bounds = [("top_k", self.top_k >= 1, ">= 1"), ("unfreeze_interval", self.unfreeze_interval >= 1, ">= 1"),
                  ("adapter_size", self.adapter_size >= 1, ">= 1"), ("lora_rank", self.lora_rank >= 1, ">= 1"),
                  ("lora_alpha", self.lora_alpha >= 1, ">= 1"),
                  ("encoder_lr", self.encoder_lr is None or (math.isfinite(self.encoder_lr) and self.encoder_lr > 0),
                   "a finite number > 0 (or unset: the setup's own)"),
                  ("head_lr", self.head_lr is None or (math.isfinite(self.head_lr) and self.head_lr > 0),
                   "a finite number > 0 (or unset: the head's own)"),
                  ("layer_lr_decay", 0 < self.layer_lr_decay <= 1, "in (0, 1]"),
                  ("batch_size", self.batch_size is None or self.batch_size >= 2, ">= 2 (or unset: the head's own)"),
                  ("max_steps", self.max_steps is None or self.max_steps >= 1, ">= 1 (or unset: the whole epoch)")]
        for name, holds, what in bounds:
            if not holds:
                raise SettingError(name, f"must be {what}, got {getattr(self, name)}")

    @property
    def peak_encoder_lr(self) -> float:
        """encoder_lr, or the setup's default when unset."""
        return self.encoder_lr if self.encoder_lr is not None else TUNINGS[self.setup].default_lr


def encoder_blocks(model) -> list[list[tuple[str, torch.nn.Parameter]]]:
    """The encoder's trainable blocks, top first: [layer L-1, ..., layer 0, embeddings and the rest].

    Each architecture's layer list comes from featurize.architectures (one table); the pooler is never
    trained (mean pooling does not use it)."""
    return layer_blocks(model)


def n_unfrozen(cfg: FinetuneConfig, step: int, n_blocks: int) -> int:
    """How many blocks (from the top) train at `step`."""
    if cfg.unfreeze == "all":
        return n_blocks
    if cfg.unfreeze == "top-k":
        return min(cfg.top_k, n_blocks)
    return min(1 + step // cfg.unfreeze_interval, n_blocks)


def build_optimizer(blocks, head: torch.nn.Module, cfg: FinetuneConfig, head_lr: float,
                    head_weight_decay: float) -> torch.optim.AdamW:
    """One AdamW over every block (decay / no-decay groups) and the head. Each group carries `name`
    and `base_lr` (the peak lr the schedule scales); frozen blocks simply get no gradient."""
    groups = []
    for depth, block in enumerate(blocks):
        lr = cfg.peak_encoder_lr * cfg.layer_lr_decay ** depth
        decay = [p for n, p in block if p.dim() >= 2 and "LayerNorm" not in n]
        no_decay = [p for n, p in block if not (p.dim() >= 2 and "LayerNorm" not in n)]
        for params, wd, tag in ((decay, cfg.weight_decay, ""), (no_decay, 0.0, "/no-decay")):
            if params:
                groups.append({"params": params, "lr": lr, "base_lr": lr, "weight_decay": wd,
                               "name": f"block{depth}{tag}", "depth": depth})
    groups.append({"params": list(head.parameters()), "lr": head_lr, "base_lr": head_lr,
                   "weight_decay": head_weight_decay, "name": "head", "depth": -1})
    return torch.optim.AdamW(groups, lr=cfg.peak_encoder_lr)


def set_trainable(blocks, k: int) -> None:
    """Top k blocks train, the rest are frozen."""
    for depth, block in enumerate(blocks):
        for _, p in block:
            p.requires_grad_(depth < k)


def _pick_device(name: str) -> torch.device:
    return torch.device(pick_device(name))


def _embed_texts(model, tokenizer, texts: list[str], max_length: int, pooler: Pooler, layer: int, norm, head,
                 device: torch.device, use_bf16: bool, role: str = "query",
                 prompt_lengths: torch.Tensor | None = None) -> torch.Tensor:
    """texts (each under its prompt, heads.apply.row_inputs) in `role` -> head outputs (1, B, d): the shared
    encode-and-pool step (the store's sentence embedding, its Normalize as the store is read) -> Normalizer ->
    head (a query-side head: queries only)."""
    return head.encode(norm(sentence_embeddings(model, tokenizer, texts, max_length, pooler, layer, device,
                                                use_bf16, prompt_lengths)), role)  # (1, B, d)


def _norm_to(norm, device):
    norm.center, norm.scale = norm.center.to(device), norm.scale.to(device)
    return norm


def finetune(head_dir: str, out_dir: str, cfg: FinetuneConfig, store_path: str | None = None,
             data_path: str | None = None, encoder: str | None = None, progress: bool = True) -> dict:
    """Train encoder + head end to end for one epoch on the head's train pairs; write `out_dir`.

    `store_path`, `data_path`: default to the head's own (config.json); `model`: the encoder the store was
    featurized with (`encoder`, default: the store's model_id, e.g. `minilm`; a local model dir must be given)."""
    t0 = time.perf_counter()
    head, norm, head_config = load_head(head_dir)
    src = _training_source(head_config, store_path or head_config["store"], data_path or head_config["data"],
                           head_dir)
    model, tokenizer, model_dir = _load_encoder(cfg, encoder or head_config.get("encoder_dir")
                                                or src.parts["model_id"], src.parts, src.store_path)
    device = next(model.parameters()).device
    head.to(device).train()
    norm = _norm_to(norm, device)
    for p in model.parameters():
        p.requires_grad_(False)
    tuning = TUNINGS[cfg.setup](cfg)
    blocks = tuning.attach(model)  # what trains, top first (set_trainable turns them on)
    train_cfg = src.train_cfg
    head_lr = cfg.head_lr if cfg.head_lr is not None else train_cfg.lr
    opt = build_optimizer(blocks, head, cfg, head_lr, train_cfg.weight_decay)
    negatives = _negatives(src, cfg)
    inputs = RowInputs(src.store, tokenizer)  # each row's text under the prompt featurize gave it
    use_bf16 = tuning_precision(src.parts, device.type, cfg.bf16)  # the autocast: bf16, fp16 or fp32
    pooler = Pooler.of(SentenceSpec.from_parts(src.parts), model_dir)

    def embed(rows: torch.Tensor, role: str = "query") -> torch.Tensor:  # store rows (B,) -> (1, B, d)
        texts, prompt_lengths = inputs(rows.tolist())
        return _embed_texts(model, tokenizer, texts, int(src.parts["max_length"]), pooler, src.layer, norm, head,
                            device, use_bf16, role, prompt_lengths)
    history, unfrozen_at, steps = _train(src, cfg, blocks, head, opt, embed, negatives, progress)
    counts = {"trainable_params": sum(p.numel() for b in blocks for _, p in b),
              "encoder_params": sum(p.numel() for p in model.parameters())}
    return _write_outputs(Path(out_dir), model, tokenizer, Path(model_dir), head, norm, head_dir, head_config,
                          src.parts, cfg, history, unfrozen_at, time.perf_counter() - t0, len(blocks), steps,
                          len(src.pairs), tuning, counts)


@dataclass
class _Source:
    """What a head was trained on, rebuilt from its config: the store, the task's training set and settings."""

    store_path: str
    store: FeatureStore
    parts: dict  # the store's manifest
    array: str
    layer: int  # the encoder layer the head's array holds
    train_cfg: TrainConfig
    task: object  # heads.kinds.Task
    pairs: object  # heads.kinds.TrainSet: what the loss trains on, as train-head


def _training_source(head_config: dict, store_path: str, data_path: str, head_dir: str) -> _Source:
    store = FeatureStore.open(store_path)
    if store.fingerprint != head_config["store_fingerprint"]:
        raise ValueError(f"{store_path}: fingerprint differs from the one {head_dir} was trained on; "
                         f"give the store the head was trained on (--store)")
    parts = store.manifest
    array = head_config.get("array", "features")
    layer = int(parts["arrays"][array]["layer"]) if isinstance(parts["arrays"][array], dict) else parts["layers"][0]
    train_cfg = TrainConfig.from_dict(head_config["train"])
    task = load_task(data_path, store, head_config.get("format"))
    task = kind_of(task).for_training(task, train_cfg)  # labels: shots, hierarchy
    pairs = kind_of(task).train_set(task, train_cfg.loss)
    return _Source(store_path, store, parts, array, layer, train_cfg, task, pairs)


def _load_encoder(cfg: FinetuneConfig, encoder: str, parts: dict, store_path: str):
    """(model in train mode on the device, tokenizer, model dir) of the encoder that featurized the store."""
    try:
        model_dir = resolve_model(encoder)
    except ValueError as err:  # a store records a local encoder by its folder name only
        raise ValueError(f"{err.args[0]}: {store_path} was featurized with it; give its folder with --model") from None
    if has_adapters(model_dir):
        raise ValueError(f"{encoder}: carries bottleneck adapters (cli finetune --setup adapters); finetune starts "
                         "from a plain encoder folder: give the base encoder and a head trained on its store")
    identity = model_identity(model_dir, parts["max_length"])
    if identity.weights_hash != parts["weights_hash"]:
        raise ValueError(f"{encoder}: its weights differ from those that featurized {store_path} "
                         f"(weights_hash); give the encoder the head's store was featurized with (--model)")
    device = _pick_device(cfg.device)
    torch.manual_seed(cfg.seed)
    # fp32 master weights whatever dtype the checkpoint was saved in (transformers 5 loads its own: dtype "auto");
    # the forward runs under autocast in the store's half dtype (row_inputs.tuning_precision)
    model = AutoModel.from_pretrained(model_dir, use_safetensors=True, trust_remote_code=False).float().to(device)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    if cfg.gradient_checkpointing:  # transformers 5 renamed it (the old name warns: removed in v6)
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    model.train()
    return model, tokenizer, model_dir


def _negatives(src: _Source, cfg: FinetuneConfig) -> torch.Tensor | None:
    """(P, K) store rows: given negatives, plus hard negatives mined once on the stored features."""
    spec, pairs, train_cfg = LOSSES[src.train_cfg.loss], src.pairs, src.train_cfg
    negatives = torch.as_tensor(pairs.negative) if spec.negatives and pairs.negative is not None else None
    mined_k = train_cfg.mined_k if cfg.mined_k is None else cfg.mined_k
    if spec.negatives and mined_k and src.task.corpus_rows is not None:
        mined = mine_negatives(load_features(src.store, src.array), pairs.anchor, src.task.corpus_rows,
                               src.task.relevant, mined_k, None, 1, energy=train_cfg.eval_energy)[0]
        negatives = mined if negatives is None else torch.cat([negatives, mined], dim=-1)
    return negatives


def _train(src: _Source, cfg: FinetuneConfig, blocks, head, opt, embed, negatives, progress: bool):
    """One epoch (or --max-steps) of encoder + head: (history, step -> blocks unfrozen, steps)."""
    pairs, train_cfg, task, n_rows = src.pairs, src.train_cfg, src.task, src.store.n_texts + 1
    P = len(pairs)
    B = min(cfg.batch_size or train_cfg.batch_size, P)
    steps = math.ceil(P / B) if cfg.max_steps is None else min(math.ceil(P / B), cfg.max_steps)
    sched = train_cfg.replace(warmup_ratio=cfg.warmup_ratio)
    order = torch.randperm(P, generator=torch.Generator().manual_seed(cfg.seed))
    sampler = kind_of(task).sampler(task)  # labelled texts: P classes x K texts per batch
    batches = sampler([train_cfg], [torch.Generator().manual_seed(cfg.seed)], B, steps)[0] if sampler else None
    anchor, positive = torch.as_tensor(pairs.anchor), torch.as_tensor(pairs.positive)
    labels_all = None if pairs.targets is None else torch.as_tensor(pairs.targets, dtype=torch.float32)
    relevant = torch.as_tensor(sorted(a * n_rows + p for a, p in task.relevant), dtype=torch.long)
    loss_fn, loss_cfg = get_loss(train_cfg.loss, pairs.form), train_cfg.loss_config()
    device = next(head.parameters()).device
    trainable = [p for b in blocks for _, p in b] + list(head.parameters())
    history, unfrozen_at = [], {}
    bar = progress_bar(total=steps, desc=f"finetune ({cfg.setup}, {cfg.unfreeze})", disable=not progress)
    for step in range(steps):
        k = n_unfrozen(cfg, step, len(blocks))
        if k not in unfrozen_at.values():
            set_trainable(blocks, k)
            unfrozen_at[step] = k
        idx = batches[step] if batches is not None else order[step * B:(step + 1) * B]
        a_rows, p_rows = anchor[idx], positive[idx]
        za = embed(a_rows, "query")  # (1, b, d)
        same_rows = torch.equal(a_rows, p_rows) and head.cfg.sides == "both"  # labelled texts: anchor = positive
        zp = za if same_rows else embed(p_rows, "document")
        zn = None
        if negatives is not None:
            n_idx = negatives[idx]  # (b, K)
            zn = embed(n_idx.flatten(), "document").unflatten(1, n_idx.shape)  # (1, b, K, d)
        labels = labels_all[idx].unsqueeze(0).to(device) if labels_all is not None else None  # (1, b[, L])
        same = same_mask(a_rows, p_rows, relevant, n_rows).to(device)  # (b, b)
        loss = loss_fn(za.float(), zp.float(), None if zn is None else zn.float(), labels,
                       energy=train_cfg.energy, cfg=loss_cfg, same=same)[0]
        _step(loss, step, steps, opt, trainable, cfg, sched)
        history.append({"step": step + 1, "loss": float(loss.detach()), "unfrozen_blocks": k})
        bar.update(1)
        bar.set_postfix(loss=f"{history[-1]['loss']:.4f}", blocks=k)
    bar.close()
    return history, unfrozen_at, steps


def _step(loss, step: int, steps: int, opt, trainable, cfg: FinetuneConfig, sched: TrainConfig) -> None:
    """Backward, clipping and one AdamW update at the schedule's rate for `step`."""
    if not torch.isfinite(loss):
        raise RuntimeError(f"finetune: loss became {loss.item()} at step {step + 1}; lower --encoder-lr")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.grad_clip:
        torch.nn.utils.clip_grad_norm_([p for p in trainable if p.grad is not None], cfg.grad_clip)
    factor = lr_factor(step, steps, sched)
    for g in opt.param_groups:
        g["lr"] = g["base_lr"] * factor
    opt.step()


def _featurize_options(parts: dict) -> str:
    """The featurize options that give a new store this one's dtype and prompts (its fingerprint holds them)."""
    prompts = parts.get("prompts") or {}
    options = [f"--dtype {parts['dtype']}"] if parts.get("dtype") else []
    options += [f"--{role}-prompt {shlex.quote(prompts.get(role, ''))}" for role in ("query", "document") if prompts]
    return "".join(" " + o for o in options)


def _write_outputs(out: Path, model, tokenizer, model_dir: Path, head, norm, head_dir, head_config, parts,
                   cfg: FinetuneConfig, history, unfrozen_at, seconds, n_blocks, steps, n_pairs, tuning,
                   counts: dict) -> dict:
    enc_dir, new_head = out / "encoder", out / "head"
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
               "encoder_dir": str(enc_dir), "head_dir": str(new_head), "n_pairs": n_pairs, "steps": steps,
               "n_blocks": n_blocks, "unfrozen_at_step": {str(k): v for k, v in unfrozen_at.items()},
               "first_loss": history[0]["loss"], "last_loss_mean10": float(np.mean([h["loss"] for h in history[-10:]])),
               "seconds": round(seconds, 1), "fingerprint": fingerprint, "history": history,
               "next": [f"cli featurize --model {enc_dir} --data {head_config['data']}{_featurize_options(parts)} "
                        "--store STORE2",
                        f"cli eval --store STORE2 --head {new_head} --data {head_config['data']} --out EVAL"]}
    config = {**head_config, "store": None, "store_fingerprint": fingerprint, "encoder_dir": str(enc_dir),
              "store_manifest": {**head_config.get("store_manifest", {}), **new_parts, "fingerprint": fingerprint},
              "finetune": {k: v for k, v in summary.items() if k != "history"}}
    write_head_dir(new_head, head, norm, config)
    atomic_write_json(out / "finetune.json", summary, indent=1)
    return summary
