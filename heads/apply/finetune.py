"""`cli finetune`: unfreeze the encoder under a trained head and train both end to end until dev stops improving.

Starts from a `cli train-head --out` directory: the head, its Normalizer and its config (training
settings, dataset, the store it was trained on). The encoder named in that store's manifest is loaded,
the train pairs' texts are tokenised on the fly (`store.texts` maps row -> text), pooled as the store
pooled them, passed through the saved Normalizer and the head, and trained with the head's own loss
(`heads.scoring.losses`, the same in-batch `same` mask and label handling as `heads.training.train`), on the
same negatives as the head (its mined_k, mined once on the stored features), whose embeddings come from a
cache refreshed each epoch (heads.apply.finetune_negatives: ANCE's asynchronous negative cache; the head
learns from them, the encoder from anchors and positives only).

Epochs (heads.apply.finetune_train): up to `max_epochs`, dev scored at the start and after each epoch with the
training encoder on the dev queries / pairs and a fixed corpus subsample (heads.apply.finetune_dev), stopped
after `patience` epochs without a dev improvement, the best epoch's encoder trainables and head restored
(`keep`: "best"; "last" keeps the final state).

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
- `finetune.json`: settings, losses, the dev curve (`dev_curve`, `dev_metric`), `best_epoch`, `best_dev`,
  `epochs_run`, `stopped_because` (patience | max_epochs | max_steps), seconds per step / cache refresh / dev
  (`timing`), `resumed_at_epochs` and `earlier_seconds` (killed processes', in `seconds`), the next commands;
- while it runs, `checkpoint.pt` (heads.apply.finetune_resume): a killed run called again with the same out dir
  goes on from its last finished epoch, bit for bit; another run's checkpoint is refused.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

from headstore.data.errors import SettingError
from headstore.featurize.encoder.adapters import has_adapters
from headstore.featurize.encoder.architectures import layer_blocks
from headstore.featurize.encoder.model import model_identity, pick_device, resolve_model
from headstore.featurize.encoder.pooling import Pooler
from headstore.featurize.encoder.sentence import SentenceSpec
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.apply.finetune_dev import DevScorer, dev_task
from headstore.heads.apply.finetune_outputs import write_outputs
from headstore.heads.artefacts.judged import read_record
from headstore.heads.apply.finetune_negatives import RowEncoder, mined_negatives
from headstore.heads.apply.finetune_resume import Checkpoint, run_key
from headstore.heads.apply.finetune_train import Trainer
from headstore.heads.apply.row_inputs import RowInputs, tuning_precision
from headstore.heads.apply.tunings import TUNINGS
from headstore.heads.settings.config import TrainConfig
from headstore.heads.kinds import kind_of, load_task
from headstore.heads.network.features import array_list
from headstore.heads.training.run import load_head

UNFREEZE_MODES = ("all", "top-k", "gradual")
KEEP_MODES = ("best", "last")  # FinetuneConfig.keep


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
    # mined hard negatives per pair; None -> the head's mined_k (the same negatives as the head). They are
    # encoded without gradients into a per-epoch cache (finetune_negatives): with gradients, 8 per pair
    # needed ~22 GB for one SciFact epoch on a CPU (killed for memory)
    mined_k: int | None = None
    # epochs cap; None -> the head's epochs (the budget the head it is compared with had). Dev stops it sooner
    max_epochs: int | None = None
    # epochs without a dev improvement before stopping: 2 lets one noisy dip of a small dev set (SciFact's 81
    # queries) pass, and costs at most two epochs past the best (train-head's 3 is on far cheaper epochs)
    patience: int = 2
    # dev corpus subsample (IR): every document judged for a dev query plus this many others, encoded on the
    # fly each epoch: ~1/5 of SciFact's 5,183 documents, enough distractors that nDCG@10 moves with the encoder
    dev_docs: int = 1000
    max_steps: int | None = None  # cap on the steps of the whole run (tests, smoke runs); None = no cap
    # the state written: "best" the best dev epoch's, the starting point included (a run that never beats it
    # writes the encoder and head it started from, as train-head's guard); "last" the final one (what a fixed
    # amount of training does: cli forgetting's one epoch, tests of the training mechanics)
    keep: str = "best"
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, ~30% slower
    device: str = "auto"  # auto = cuda when available
    bf16: bool = True  # bf16 autocast on CUDA (ignored on CPU)
    seed: int = 0  # batch order and dropout

    def __post_init__(self):
        if self.setup not in TUNINGS:
            raise ValueError(f"setup={self.setup!r}; valid: {sorted(TUNINGS)}")
        if self.keep not in KEEP_MODES:
            raise ValueError(f"keep={self.keep!r}; valid: {list(KEEP_MODES)}")
        if self.unfreeze not in UNFREEZE_MODES:
            raise ValueError(f"unfreeze={self.unfreeze!r}; valid: {list(UNFREEZE_MODES)}")
        # head_lr, batch_size, mined_k, max_epochs: None takes the head's own; max_steps None: no cap
        bounds = [("top_k", self.top_k >= 1, ">= 1"), ("unfreeze_interval", self.unfreeze_interval >= 1, ">= 1"),
                  ("adapter_size", self.adapter_size >= 1, ">= 1"), ("lora_rank", self.lora_rank >= 1, ">= 1"),
                  ("lora_alpha", self.lora_alpha >= 1, ">= 1"),
                  ("encoder_lr", self.encoder_lr is None or (math.isfinite(self.encoder_lr) and self.encoder_lr > 0),
                   "a finite number > 0 (or unset: the setup's own)"),
                  ("head_lr", self.head_lr is None or (math.isfinite(self.head_lr) and self.head_lr > 0),
                   "a finite number > 0 (or unset: the head's own)"),
                  ("layer_lr_decay", 0 < self.layer_lr_decay <= 1, "in (0, 1]"),
                  ("batch_size", self.batch_size is None or self.batch_size >= 2, ">= 2 (or unset: the head's own)"),
                  ("max_epochs", self.max_epochs is None or self.max_epochs >= 1, ">= 1 (or unset: the head's epochs)"),
                  ("patience", self.patience >= 1, ">= 1 (epochs without a dev improvement before stopping)"),
                  ("dev_docs", self.dev_docs >= 0, ">= 0 (corpus documents beside the dev queries' judged ones)"),
                  ("mined_k", self.mined_k is None or self.mined_k >= 0, ">= 0 (or unset: the head's mined_k)"),
                  ("max_steps", self.max_steps is None or self.max_steps >= 1, ">= 1 (or unset: no cap)")]
        for name, holds, what in bounds:
            if not holds:
                raise SettingError(name, f"must be {what}, got {getattr(self, name)}")

    @property
    def peak_encoder_lr(self) -> float:
        """encoder_lr, or the setup's default when unset."""
        return self.encoder_lr if self.encoder_lr is not None else TUNINGS[self.setup].default_lr


def encoder_blocks(model) -> list[list[tuple[str, torch.nn.Parameter]]]:
    """The encoder's trainable blocks, top first: [layer L-1, ..., layer 0, embeddings and the rest].

    Each architecture's layer list comes from featurize.encoder.architectures (one table); the pooler is never
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


def _norm_to(norm, device):
    norm.center, norm.scale = norm.center.to(device), norm.scale.to(device)
    return norm


def finetune(head_dir: str, out_dir: str, cfg: FinetuneConfig, store_path: str | None = None,
             data_path: str | None = None, encoder: str | None = None, progress: bool = True) -> dict:
    """Train encoder + head end to end on the head's train pairs until dev stops improving (module doc); write
    `out_dir` with the best epoch's encoder and head (cfg.keep "last": the final ones); resumed from this run's
    checkpoint in `out_dir` (module doc).

    `store_path`, `data_path`: default to the head's own (config.json); `model`: the encoder the store was
    featurized with (`encoder`, default: the store's model_id, e.g. `minilm`; a local model dir must be given)."""
    t0 = time.perf_counter()
    run = prepare(head_dir, cfg, store_path, data_path, encoder)
    earlier, _ = read_record(head_dir, run.head_config)  # the source's judgements, kept by the tuned head (a damaged
    # record: one line before training; none kept: the run's own alone)
    checkpoint = Checkpoint(Path(out_dir), run_key(cfg, run), t0)
    report = {**run.trainer.run(run.dev, progress, checkpoint), **checkpoint.describe()}
    summary = write_outputs(Path(out_dir), run, head_dir, cfg, report, checkpoint.seconds(), earlier)
    checkpoint.remove()
    return summary


@dataclass
class Prepared:
    """A finetune run ready to train: the encoder (its setup attached), the head, the training loop, dev."""

    model: torch.nn.Module
    tokenizer: object
    model_dir: Path
    head: torch.nn.Module
    norm: object  # the head's Normalizer, on the device
    head_config: dict
    src: "_Source"
    tuning: object  # the TUNINGS setup attached to `model`
    trainer: Trainer
    dev: DevScorer | None  # None: the task has no dev split (every epoch runs, the last is kept)


def prepare(head_dir: str, cfg: FinetuneConfig, store_path: str | None = None, data_path: str | None = None,
            encoder: str | None = None) -> Prepared:
    """Everything `finetune` trains with, built from the head's directory (its args)."""
    head, norm, head_config = load_head(head_dir)
    _check_one_array(head_config, head_dir)  # before the store, the data or the encoder is read
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
    inputs = RowInputs(src.store, tokenizer)  # each row's text under the prompt featurize gave it
    use_bf16 = tuning_precision(src.parts, device.type, cfg.bf16)  # the autocast: bf16, fp16 or fp32
    pooler = Pooler.of(SentenceSpec.from_parts(src.parts), model_dir)
    row_encoder = RowEncoder(model, tokenizer, inputs, int(src.parts["max_length"]), pooler, src.layer, device,
                             use_bf16)
    trainer = Trainer(src, cfg, blocks, head, norm, opt, row_encoder, mined_negatives(src, cfg),
                      lambda step: n_unfrozen(cfg, step, len(blocks)), set_trainable)
    dev = dev_task(src.task, cfg.dev_docs)
    scorer = None if dev is None else DevScorer(dev, row_encoder, norm, head, train_cfg.eval_energy,
                                                train_cfg.precision)
    return Prepared(model, tokenizer, Path(model_dir), head, norm, head_config, src, tuning, trainer, scorer)


def _check_one_array(head_config: dict, head_dir: str) -> None:
    """A head that reads several stored arrays (a scalar or concat layer mix) cannot be tuned with its encoder
    (the tuned encoder gives one layer's features): ValueError saying what to do instead."""
    arrays = array_list(head_config.get("array", "features"))
    if len(arrays) > 1:
        raise ValueError(f"{head_dir}: the head reads {len(arrays)} stored arrays ({'+'.join(arrays)}, a "
                         f"{head_config.get('head', {}).get('mix_mode', 'scalar')} layer mix); cli finetune tunes "
                         "an encoder under a head of one array: train a head on one array (--array features) and "
                         "finetune that")


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
