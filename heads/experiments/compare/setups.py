"""The setups `cli compare` puts side by side: two registries, and the steps that build one encoder.

ENCODERS: how each encoder is made from the base one.
  base       the frozen encoder itself (one store for every seed)
  adapted    MLM adaptation on the in-domain texts, starting from the probe MLM head (a head trained on
             the frozen encoder first, so the encoder is never fed a random head's gradients), then a head
  finetuned, adapters, lora: `cli finetune` from seed s's frozen + head, with FinetuneConfig.setup =
             TUNED[name] (encoder and head trained together on the task's pairs, the head's own loss and
             negatives, until dev stops improving), its encoder lr chosen on dev at the first tuning seed
SETUPS: one table row each = an encoder with a head trained on its features ("trained"), the head
trained together with it ("joint"), or no head (its own cosine).

Adding a setup is one line in each registry (a `finetune` tuning: one line in TUNED).
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from headstore.data.keys import content_digest, resolved


@dataclass(frozen=True)
class Setup:
    label: str  # the table's row name
    encoder: str  # a key of ENCODERS
    head: str | None  # "trained" (train-head on the encoder's store), "joint" (finetune's head), None (cosine)


ENCODERS = {  # name -> how it is made (the module doc)
    "base": "frozen", "adapted": "mlm", "finetuned": "finetune", "adapters": "finetune", "lora": "finetune"}
TUNED = {"finetuned": "full", "adapters": "adapters", "lora": "lora"}  # encoder -> FinetuneConfig.setup
SETUPS = {
    "frozen-cosine": Setup("frozen encoder, cosine (no head)", "base", None),
    "frozen-head": Setup("frozen encoder + head", "base", "trained"),
    "adapted-cosine": Setup("MLM-adapted encoder, cosine", "adapted", None),
    "adapted-head": Setup("MLM-adapted encoder + head", "adapted", "trained"),
    "adapters-cosine": Setup("adapters encoder, cosine", "adapters", None),
    "adapters-head": Setup("adapters + head", "adapters", "joint"),
    "lora-cosine": Setup("LoRA encoder, cosine", "lora", None),
    "lora-head": Setup("LoRA + head", "lora", "joint"),
    "finetuned-cosine": Setup("fine-tuned encoder, cosine", "finetuned", None),
    "finetuned-head": Setup("fine-tuned encoder + head", "finetuned", "joint"),
}
REFERENCE = "frozen-head"  # every setup's paired difference is taken against this one


def model_key(model: str) -> dict:
    """The base encoder in a step's key (data/keys.py's rule): a local model's files by their contents, a Hub id
    by its name."""
    from headstore.featurize.encoder.model import resolve_model

    where = resolve_model(model)
    return {"weights": content_digest(where, "--model")} if Path(where).is_dir() else {"model": model}


def finetune_setting(cfg, encoder: str, seed: int):
    """The FinetuneConfig of `encoder` at `seed`: the [finetune] section with its tuning and seed."""
    fields = {f.name for f in dataclasses.fields(cfg.finetune)}
    if "setup" not in fields:  # a finetune without tunings knows only the full one
        if TUNED[encoder] != "full":
            raise ValueError(f"setup {encoder!r} needs `cli finetune` tunings (adapters, LoRA); valid here: "
                             f"{sorted(s for s, v in SETUPS.items() if v.encoder in ('base', 'adapted', 'finetuned'))}")
        return dataclasses.replace(cfg.finetune, seed=seed)
    return dataclasses.replace(cfg.finetune, setup=TUNED[encoder], seed=seed)


@dataclass
class Built:
    """One encoder at one seed: its store, the head of each of its setups, what making it cost."""

    encoder: str
    seed: int | None  # the seed the encoder was tuned at (None: the frozen one, the same at every seed)
    store: Path
    model_dir: Path | None  # None: the base model (scored with the probe MLM head)
    heads: dict  # "trained" | "joint" -> head dir
    steps: list  # the step names it took (seconds and peak memory come from their records)
    trainable: dict  # "trained" | "joint" | None -> trainable parameters of that setup
    head_key: dict | None = None  # the settings key of its trained head (what a finetune from it depends on)
    tuning: dict | None = None  # a tuned encoder's run: the encoder_lr chosen on dev, `candidates` [(lr, its best
    # dev figure; NaN: none)] tried at `chosen_at_seed`, this run's best_epoch, best_dev, epochs_run, stopped_because


def _meta_encoder(model_dir: str):
    """The encoder of `model_dir` with shapes only (the meta device: nothing allocated, nothing read)."""
    import torch
    from transformers import AutoConfig, AutoModel

    with torch.device("meta"):
        return AutoModel.from_config(AutoConfig.from_pretrained(model_dir))


def count_parameters(model_dir: str) -> int:
    """Parameters of the encoder in `model_dir` that train when the whole encoder does: its blocks
    (featurize.encoder.architectures.layer_blocks, as finetune and adapt train them: not the pooler, which mean pooling
    never uses); every parameter of an architecture outside that table."""
    from headstore.featurize.encoder.architectures import layer_blocks

    model = _meta_encoder(model_dir)
    try:
        return sum(p.numel() for block in layer_blocks(model) for _, p in block)
    except ValueError:  # no layout known: all of it
        return sum(p.numel() for p in model.parameters())


def trained_encoder_parameters(summary: dict) -> int:
    """The encoder parameters a finetune run trained, from its finetune.json: those of the blocks unfrozen by
    its end (all; top-k: the top k; gradual: as many as `unfrozen_at_step` reached), the setup's blocks
    (whole layers, adapters or LoRA matrices) rebuilt from its config on the source encoder's shapes."""
    import torch
    from headstore.heads.apply.finetune import FinetuneConfig
    from headstore.heads.apply.tunings import TUNINGS

    names = {f.name for f in dataclasses.fields(FinetuneConfig)}
    fcfg = FinetuneConfig(**{k: v for k, v in summary["config"].items() if k in names})
    model = _meta_encoder(summary["source_encoder"])
    with torch.device("meta"):  # adapters and LoRA matrices: shapes only too
        blocks = TUNINGS[fcfg.setup](fcfg).attach(model)
    assert len(blocks) == summary["n_blocks"], (len(blocks), summary["n_blocks"])
    top = max(summary["unfrozen_at_step"].values(), default=0)  # blocks trained by the last step, from the top
    return sum(p.numel() for block in blocks[:top] for _, p in block)


def head_parameters(head_dir: Path) -> int:
    from headstore.heads.training.run import load_head

    model, _, _ = load_head(str(head_dir))
    return sum(p.numel() for p in model.parameters())


class Builder:
    """Makes (or reuses, through `steps`) every encoder of a compare run at each seed."""

    def __init__(self, cfg, steps, featurize_step, train_head_step, adapt_step):
        self.cfg, self.steps = cfg, steps
        self.featurize, self.train_head, self.adapt = featurize_step, train_head_step, adapt_step
        self.base_params = None

    def base(self, seeds, base_model_dir: str) -> dict[int, Built]:
        store, key = self.featurize("featurize-base", self.cfg.model, model_key(self.cfg.model), self.cfg.base_store)
        self.base_store, self.base_key = store, key
        self.base_params = count_parameters(base_model_dir)
        out = {}
        for s in seeds:
            head, head_key = self.train_head(f"head-base-s{s}", store, key, s)
            out[s] = Built("base", None, store, None, {"trained": head}, ["featurize-base", f"head-base-s{s}"],
                           {None: 0, "trained": head_parameters(head)}, head_key)
        return out

    def adapted(self, seeds, tune_seeds, probe: Path, probe_step: str) -> dict[int, Built]:
        out = {}
        for s in seeds:
            t = s if s in tune_seeds else tune_seeds[0]  # beyond the tuning seeds: seed t's encoder, seed s's head
            model, key = self.adapt(f"adapt-s{t}", probe, t)
            store, fkey = self.featurize(f"featurize-adapted-s{t}", str(model), key)
            head, _ = self.train_head(f"head-adapted-s{s}", store, fkey, s)
            n_head = head_parameters(head)
            enc = self.base_params  # the whole encoder trains (its MLM head too, not counted: not used after)
            out[s] = Built("adapted", t, store, model, {"trained": head},
                           [probe_step, f"adapt-s{t}", f"featurize-adapted-s{t}", f"head-adapted-s{s}"],
                           {None: enc, "trained": enc + n_head})
        return out

    def tuned(self, name: str, seeds, tune_seeds, base: dict[int, Built]) -> dict[int, Built]:
        """Encoder `name` tuned from each tuning seed's frozen + head. Its encoder lr is chosen on dev at the FIRST
        tuning seed among cfg.lr_grid x the setup's default (each candidate its own keyed step, reused by a rerun;
        the chosen candidate's run is that seed's run) and kept for the other seeds."""
        out, chosen = {}, None
        for s in [s for s in seeds if s in tune_seeds]:  # a finetune-family row has the tuning seeds only
            fcfg = finetune_setting(self.cfg, name, s)
            if chosen is None:
                lrs = [fcfg.peak_encoder_lr * f for f in self.cfg.lr_grid]
                runs = {lr: self._finetune(_step_name(name, s, lr, len(lrs)), fcfg, lr, base[s]) for lr in lrs}
                lr = pick_lr({lr: run[1].get("best_dev") for lr, run in runs.items()})
                chosen = {"encoder_lr": lr, "chosen_at_seed": s, "dev_metric": runs[lr][1].get("dev_metric"),
                          "candidates": [(c, _figure(run[1].get("best_dev"))) for c, run in runs.items()]}
                ran = [_step_name(name, s, c, len(lrs)) for c in lrs]
                folder, result, key = runs[lr]
            else:
                ran = [f"{name}-s{s}"]
                folder, result, key = self._finetune(ran[0], fcfg, chosen["encoder_lr"], base[s])
            store, _ = self.featurize(f"featurize-{name}-s{s}", str(folder / "encoder"), key)
            out[s] = Built(name, s, store, folder / "encoder", {"joint": folder / "head"},
                           [*base[s].steps, *ran, f"featurize-{name}-s{s}"], tuned_trainable(result, folder),
                           tuning=tuned_record(chosen, result))
        return out

    def _finetune(self, step: str, fcfg, lr: float, base: Built) -> tuple[Path, dict, dict]:
        """(folder, record, key) of `cli finetune` at encoder lr `lr` from `base`'s frozen + head, as step `step`."""
        from headstore.heads.apply.finetune import finetune

        fcfg = dataclasses.replace(fcfg, encoder_lr=lr)
        key = {"head": base.head_key, "finetune": resolved(fcfg), "model": model_key(self.cfg.model),
               "data": content_digest(self.cfg.in_domain, "--in-domain ([data] in_domain)")}
        head_dir = base.heads["trained"]
        folder, result = self.steps.run(step, key, lambda d: _tuned_result(
            finetune(str(head_dir), str(d), fcfg, str(self.base_store), self.cfg.in_domain, self.cfg.model,
                     progress=True)), "finetune")
        return folder, result, key


def _step_name(name: str, seed: int, lr: float, n_candidates: int) -> str:
    """The finetune step of encoder `name` at `seed`: one candidate of several carries its lr in its name."""
    return f"{name}-s{seed}" if n_candidates == 1 else f"{name}-s{seed}-lr{lr:g}"


def pick_lr(candidates: dict[float, float | None]) -> float:
    """The lr whose run's best dev figure is highest (ties: the first in grid order); without any finite figure
    (no dev split) the middle candidate, the default when the grid is the usual {0.5, 1, 2}."""
    scored = [(dev, -i, lr) for i, (lr, dev) in enumerate(candidates.items())
              if dev is not None and math.isfinite(dev)]
    if not scored:
        return list(candidates)[len(candidates) // 2]
    return max(scored)[2]


def _figure(value) -> float:
    return float("nan") if value is None else float(value)


def tuned_record(chosen: dict, result: dict) -> dict:
    """Built.tuning: the lr choice and this seed's run (how long it trained, why it stopped, its dev figure)."""
    return {**chosen, **{k: result.get(k) for k in ("best_epoch", "best_dev", "epochs_run", "stopped_because")}}


def _tuned_result(summary: dict) -> dict:
    """The finetune step's record: its summary less the loss history, with the parameters it trained: the
    encoder's (`encoder_trainable_parameters`: the blocks unfrozen by its end, not finetune's
    `trainable_params`, which counts every block whatever `unfreeze` says) and with the head's
    (`trainable_parameters`, the joint row's count)."""
    keep = {k: v for k, v in summary.items() if k != "history"}
    encoder = trained_encoder_parameters(summary)
    keep["encoder_trainable_parameters"] = encoder
    keep["trainable_parameters"] = encoder + head_parameters(Path(summary["head_dir"]))
    return keep


def tuned_trainable(result: dict, folder: Path) -> dict:
    """Built.trainable of a tuned encoder: its cosine row the encoder's trained parameters, its joint row those
    and the head's. A record written before the count was corrected is recounted from its finetune.json."""
    if "encoder_trainable_parameters" not in result:
        result = _tuned_result(json.loads((folder / "finetune.json").read_text()))
    return {None: int(result["encoder_trainable_parameters"]), "joint": int(result["trainable_parameters"])}
