"""The setups `cli compare` puts side by side: two registries, and the steps that build one encoder.

ENCODERS: how each encoder is made from the base one.
  base       the frozen encoder itself (one store for every seed)
  adapted    MLM adaptation on the in-domain texts, starting from the probe MLM head (a head trained on
             the frozen encoder first, so the encoder is never fed a random head's gradients), then a head
  finetuned, adapters, lora: `cli finetune` from seed s's frozen + head, with FinetuneConfig.setup =
             TUNED[name] (encoder and head trained together on the task's pairs, the head's own loss)
SETUPS: one table row each = an encoder with a head trained on its features ("trained"), the head
trained together with it ("joint"), or no head (its own cosine).

Adding a setup is one line in each registry (a `finetune` tuning: one line in TUNED).
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path


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


def count_parameters(model_dir: str) -> int:
    """Parameters of the encoder in `model_dir` (all of them train when the whole encoder does)."""
    import torch
    from transformers import AutoConfig, AutoModel

    with torch.device("meta"):  # shapes only: nothing allocated
        model = AutoModel.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())


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
        store, key = self.featurize("featurize-base", self.cfg.model, {"model": self.cfg.model}, self.cfg.base_store)
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
            enc = self.base_params  # the whole encoder trains (plus the MLM head, not counted: not used after)
            out[s] = Built("adapted", t, store, model, {"trained": head},
                           [probe_step, f"adapt-s{t}", f"featurize-adapted-s{t}", f"head-adapted-s{s}"],
                           {None: enc, "trained": enc + n_head})
        return out

    def tuned(self, name: str, seeds, tune_seeds, base: dict[int, Built]) -> dict[int, Built]:
        from headstore.heads.apply.finetune import finetune

        out = {}
        for s in seeds:
            if s not in tune_seeds:
                continue  # no head of its own beside the encoder: the row has the tuning seeds only
            fcfg = finetune_setting(self.cfg, name, s)
            key = {"head": base[s].head_key, "finetune": asdict(fcfg)}
            head_dir = base[s].heads["trained"]
            folder, result = self.steps.run(f"{name}-s{s}", key, lambda d, fcfg=fcfg, head_dir=head_dir: _tuned_result(
                finetune(str(head_dir), str(d), fcfg, str(self.base_store), self.cfg.in_domain, self.cfg.model,
                         progress=True), self.base_params))
            store, _ = self.featurize(f"featurize-{name}-s{s}", str(folder / "encoder"), key)
            trainable = int(result["trainable_parameters"])
            out[s] = Built(name, s, store, folder / "encoder", {"joint": folder / "head"},
                           [*base[s].steps, f"{name}-s{s}", f"featurize-{name}-s{s}"],
                           {None: trainable, "joint": trainable})
        return out


def _tuned_result(summary: dict, encoder_parameters: int) -> dict:
    """The finetune step's record: its summary less the loss history, with the parameters it trained: the
    encoder's that trained (finetune's `trainable_params` where it reports them, else all) and the head's."""
    keep = {k: v for k, v in summary.items() if k != "history"}
    keep["trainable_parameters"] = int(summary.get("trainable_params", encoder_parameters)) \
        + head_parameters(Path(summary["head_dir"]))
    return keep


SETTLE_CHANGE = 0.02  # settled: the second half of the run lowered the MLM loss by less than 2%


def settled(curve: list[dict]) -> tuple[bool, float | None]:
    """(has the MLM loss settled, how much the second half of the run lowered it, relative) from adapt's loss
    curve ([{"step", "loss"}] of ten-step means): the mid-run window's mean against the last window's. A
    window-to-window test on the last steps alone would pass by itself under a decaying learning rate."""
    if len(curve) < 4:
        return False, None
    mid, last = curve[len(curve) // 2 - 1]["loss"], curve[-1]["loss"]
    drop = (mid - last) / mid
    return drop < SETTLE_CHANGE, drop
