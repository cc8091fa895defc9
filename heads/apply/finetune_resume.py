"""`cli finetune` across processes: a checkpoint after every epoch, resumed by the next call with the same out dir.

After each epoch's dev scoring the training loop (finetune_train.Trainer.state) hands over everything it needs
to go on bit for bit: the trainable tensors (encoder trainables + head), the optimiser's state, the RNG states
(torch CPU and CUDA: dropout; the batch order is planned up front from cfg.seed), the step, the dev curve, the
best epoch and its kept tensors, the epochs since the last improvement, the loss history, and the encoder's
no-grad embeddings of the last dev scoring (the next epoch's negatives cache reuses them, as an uninterrupted
run does). `Checkpoint.save` writes it to `OUT/checkpoint.pt.incomplete`, then renames it over
`OUT/checkpoint.pt` (a killed write leaves the old checkpoint whole; an `.incomplete` file is never read). The
finished run removes both.

A checkpoint belongs to the run that made it (`run_key`, data/keys.py's rule): every FinetuneConfig setting's
resolved value and the finetune recipe version (a default changed in the code, or a new recipe, is another run),
the source head's weights, Normalizer and config, the store's fingerprint and the data (the train pairs,
their negatives, the judged pairs and the dev set). A checkpoint of another run is refused with a one-line
error naming it rather than replaced: the out dir is the user's, an hour of training is not thrown away on a
mistyped setting, and `rm OUT/checkpoint.pt` is the one step to start over. (In `cli compare` each finetune
step's folder is named by its settings' key, so a mismatch cannot happen there.) A checkpoint of another
checkpoint FORMAT (an older headstore: format 1 keyed only the settings that differed from the defaults) cannot
be continued and is started over, said in one line.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from headstore.data.files import INCOMPLETE, fsync_dir, writing
from headstore.data.keys import recipe, resolved

CHECKPOINT = "checkpoint.pt"
FORMAT = 2  # bumped when the state's layout or key changes: an older checkpoint is started over, not misread
KEY_PARTS = ("settings", "head", "store", "data")


def _sha(*chunks: bytes) -> str:
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(len(chunk).to_bytes(8, "little"))
        h.update(chunk)
    return h.hexdigest()[:16]


def _json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, default=str).encode()


def _tensor(t: torch.Tensor | None) -> bytes:
    if t is None:
        return b"none"
    t = t.detach().cpu().contiguous()
    return _json([str(t.dtype), list(t.shape)]) + t.numpy().tobytes()


def run_key(cfg, run) -> dict:
    """{part: hash} of what made a finetune run (module doc); `run`: finetune.Prepared, before any step."""
    trainer, head_state = run.trainer, run.head.state_dict()
    head = _sha(_json(run.head_config), _tensor(run.norm.center), _tensor(run.norm.scale), _json(run.norm.kind),
                *(k.encode() + _tensor(v) for k, v in sorted(head_state.items())))
    negatives = None if trainer.cache is None else trainer.cache.rows[trainer.cache.index]
    data = _sha(_tensor(trainer.anchor), _tensor(trainer.positive), _tensor(trainer.labels), _tensor(negatives),
                _tensor(trainer.relevant), _json(None if run.dev is None else run.dev.describe()),
                _json(None if run.dev is None else _dev_rows(run.dev)))
    return {"settings": _sha(_json({**resolved(cfg), "recipe": recipe("finetune")})), "head": head, "store": run.src.store.fingerprint,
            "data": data}


def _dev_rows(dev) -> list[int]:
    from headstore.heads.kinds import kind_of

    data = dev.task.eval_sets["dev"]
    return np.asarray(kind_of(dev.task).rows(data)).reshape(-1).tolist()


class Checkpoint:
    """`OUT/checkpoint.pt` of one run (key: run_key). `t0`: when this process's run began (perf_counter), for
    the run's seconds over every process (`seconds`)."""

    def __init__(self, out: Path, key: dict, t0: float):
        self.path, self.key, self.t0 = Path(out) / CHECKPOINT, key, t0
        self.tmp = self.path.with_name(self.path.name + INCOMPLETE)
        self.earlier_seconds = 0.0  # spent by killed processes up to their last checkpoint
        self.resumed_at: list[int] = []  # the epochs this run was resumed from

    def seconds(self) -> float:
        return self.earlier_seconds + time.perf_counter() - self.t0

    def load(self) -> dict | None:
        """The state to resume from, or None (no checkpoint, or one of another FORMAT). Another run's: an error."""
        if not self.path.is_file():
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001  torch says many things about a file it cannot read
            raise ValueError(f"{self.path}: not a readable finetune checkpoint ({type(err).__name__}); "
                             "delete it to start over") from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            print(f"finetune: {self.path} was written by another headstore (checkpoint format "
                  f"{state.get('format') if isinstance(state, dict) else '?'}, this one reads {FORMAT}); "
                  "starting over", file=sys.stderr, flush=True)
            return None
        differs = [part for part in KEY_PARTS if state["key"].get(part) != self.key[part]]
        if differs:
            raise ValueError(f"{self.path}: the checkpoint of another finetune run (its {', '.join(differs)} "
                             "differ); delete it to start over, or give another --out")
        self.earlier_seconds = float(state["seconds"])
        self.resumed_at = [*state["resumed_at"], int(state["epoch"])]
        return state

    def save(self, state: dict) -> None:
        """`state` (finetune_train.Trainer.state) written whole or not at all (module doc)."""
        meta = {"format": FORMAT, "key": self.key, "seconds": self.seconds(), "resumed_at": self.resumed_at}
        assert not meta.keys() & state.keys(), sorted(meta.keys() & state.keys())
        state = {**state, **meta}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with writing(self.path):
            torch.save(state, self.tmp)
            with open(self.tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(self.tmp, self.path)
            fsync_dir(self.path.parent)

    def remove(self) -> None:
        """The finished run's checkpoint (and any half-written one) removed."""
        for path in (self.tmp, self.path):
            path.unlink(missing_ok=True)

    def describe(self) -> dict:
        """finetune.json's record of the processes: the epochs it was resumed from and the earlier seconds."""
        return {"resumed_at_epochs": self.resumed_at, "earlier_seconds": round(self.earlier_seconds, 1)}
