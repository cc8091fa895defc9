"""The settings a head trains with that its data decides: the task kind's defaults for what the user left unset
(`defaults_for_kind`), and the head's shape completed from the features and the task (`head_shape`)."""
from __future__ import annotations

from dataclasses import asdict, fields, replace

import torch

from headstore.heads.kinds import Task, kind_of
from headstore.heads.kinds.labels import classifier_width
from headstore.heads.network.features import array_list
from headstore.heads.scoring.losses import LOSSES
from headstore.heads.settings.config import KIND_DEPENDENT, HeadConfig, TrainConfig
from headstore.heads.training.anchor import anchor_pool, own_texts


def head_shape(head_cfg: HeadConfig, features: torch.Tensor, array: str, task: Task | None = None,
               cfg: TrainConfig | None = None) -> HeadConfig:
    """The head config completed from the features: in_dim (one array's dim) and mix (arrays mixed); a
    classifier head (a loss whose outputs are classes: ce) ends in the task's classes, not residual."""
    mix = len(array_list(array))
    shape = {**asdict(head_cfg), "in_dim": features.shape[1] // mix, "mix": mix}
    if cfg is not None and LOSSES[cfg.loss].outputs == "classes":
        if head_cfg.depth < 1:
            raise ValueError(f"loss {cfg.loss} trains a classifier head: it needs --depth >= 1 (its last layer "
                             "gives the class scores)")
        shape.update(out_dim=classifier_width(task), residual=False)
    return HeadConfig(**shape)


def defaults_for_kind(task: Task, head_cfg: HeadConfig, cfg: TrainConfig, unset: tuple[str, ...], arrays: int = 1):
    """(head config, train config, note): the task kind's `defaults` fill the settings left unset (graded STS
    tables, labelled texts; the kind's `defaults_for` the loss that trains); kinds without their own keep the
    dataclass defaults (the SciFact study's). `arrays`: how many stored arrays the head reads. An unset
    --normalize takes the loss's own where its registry entry names one (`LossSpec.normalize`: ce standardises)."""
    if not unset:
        return head_cfg, cfg, "every kind-dependent setting given"
    kind = kind_of(task)
    loss = kind.defaults.get("loss", cfg.loss) if "loss" in unset else cfg.loss
    defaults = kind.defaults_for(loss, cfg.shots, unlabeled=bool(cfg.shots) or task.unlabeled is not None,
                                 hierarchy=cfg.hierarchy)
    assert set(defaults) <= set(KIND_DEPENDENT), "a kind's defaults cover kind-dependent settings only"
    values = {k: defaults[k] for k in unset if k in defaults}  # the others: the dataclass defaults
    preferred = LOSSES[loss].normalize  # a loss's own input (ce: standardised features), unless the kind's
    if "normalize" in unset and preferred and "normalize" not in defaults:  # (few-shot ce: L2, heads.kinds.labels)
        values["normalize"] = preferred
    if not values:
        return head_cfg, cfg, f"{', '.join(unset)}: {kind.defaults_why}"
    side_by_side = head_cfg.mix_mode == "concat" and arrays > 1  # one array read "side by side" is that array
    no_text = bool(values.get("anchor_weight")) and not cfg.anchor_data and not len(
        anchor_pool(task, *own_texts(task)).rows)
    if values.get("anchor_weight") and (head_cfg.out_dim is not None or head_cfg.depth == 0 or side_by_side
                                        or no_text):
        values["anchor_weight"] = 0.0  # the anchor compares f(x) with x: a head of another width (or none), or one
        # reading arrays side by side (no one x), has none; nor has a task without a text of its own to anchor on
        # (positive pairs without --unlabeled); an anchor the user asks for is refused there
    head_keys = {f.name for f in fields(HeadConfig)}
    head_cfg = replace(head_cfg, **{k: v for k, v in values.items() if k in head_keys})
    cfg = cfg.replace(**{k: v for k, v in values.items() if k not in head_keys})
    off = "; the anchor off: no text of the task's own to anchor on (give --unlabeled)" if no_text else ""
    return head_cfg, cfg, f"{kind.data_words} data: {values} ({kind.defaults_why}){off}"
