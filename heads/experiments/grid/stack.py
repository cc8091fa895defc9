"""One stack of a grid trained and scored (`StackRunner.compute`: its weights and results rows, nothing written)
and saved loadably (`StackRunner.save`, by the one process that writes: heads.experiments.grid.run). The features
and frozen baselines are cached per array (and per training set, for few-shot stacks); a detached copy trains
stacks on a Ray worker (heads.experiments.grid.ray_engine).
"""
from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from headstore.heads.artefacts.files import save_stack
from headstore.heads.artefacts.task_features import TaskFeatures
from headstore.heads.evaluation.evaluate import embedder, evaluate_split
from headstore.heads.experiments.grid.inputs import transfer_split
from headstore.heads.experiments.grid.plan import flat_settings
from headstore.heads.experiments.grid.scope import heads_to_test, scored_heads
from headstore.heads.experiments.grid.spec import GRID_VERSION
from headstore.heads.kinds import PREFIX, Task, kind_of
from headstore.heads.kinds.labels import label_space
from headstore.heads.network.features import Normalizer, array_widths
from headstore.heads.network.model import StackedMLP
from headstore.heads.settings.config import TEST_SCOPES, TrainConfig
from headstore.heads.training.run import head_shape
from headstore.heads.training.selection import OodSelection
from headstore.heads.training.resolved import resolve_stack
from headstore.heads.training.train import train_stack


@dataclass
class StackResult:
    """One trained and scored stack, nothing of it written yet (what a Ray worker sends back)."""
    stack: str  # the head_id of its first head: its files' name
    head_ids: list[str]
    configs: list[TrainConfig]
    array: str
    model: StackedMLP
    norm: Normalizer
    context: dict  # StackRunner.stack_context: what its S.json says of the dataset and store
    rows: list[dict]  # one results row per head


class StackRunner:
    """Trains one stack of a grid and scores it: features and frozen baselines cached per array (and per
    training set, for few-shot stacks), each stack saved loadably, one results row per head."""

    def __init__(self, out: Path, task: Task, tf: TaskFeatures, store_path: str, data_path: str,
                 data_format: str | None, ood: dict[str, Task], selection: OodSelection, score_split: str,
                 test_scope: str = "auto", anchors: dict | None = None, unlabeled_note: dict | None = None):
        self.out, self.task, self.tf, self.ood, self.selection = out, task, tf, ood, selection
        self.anchors, self.unlabeled_note = anchors or {}, unlabeled_note or {}  # anchor pools (positions); report
        self.store = tf.store
        self.context = {"data": str(data_path), "format": data_format, "store": str(store_path)}
        self.score_split = score_split
        if test_scope not in TEST_SCOPES:
            raise ValueError(f"test scope {test_scope!r}; valid: {sorted(TEST_SCOPES)}")
        self.test_scope = test_scope
        self.baselines: dict[str, dict] = {}  # per array: frozen features on dev/test (and transfer sets)
        self._base_rows: dict[tuple, dict] = {}  # per (array, training set): frozen test metrics, `base_*`

    def features(self, array: str) -> torch.Tensor:
        return self.tf.read(array)  # the rows the grid's tasks use, read once per array

    def anchor_positions(self, cfg: TrainConfig):
        """The anchor's pool (heads.training.anchor) at positions of the features read; None: the anchor is off."""
        return self.anchors[cfg.anchor_data] if cfg.anchor_weight else None

    def detached(self, tf, store, configs: list[TrainConfig]) -> "StackRunner":
        """A copy that trains and scores stacks elsewhere (a Ray worker): the features from `tf` (`read(array)`),
        the store's facts from `store` (dim, fingerprint, manifest), the anchors' pools found before (a
        worker need not reach the store), no output folder and no baselines (this process writes both)."""
        twin = copy.copy(self)
        twin.out, twin.tf, twin.store, twin.baselines, twin._base_rows = None, tf, store, {}, {}
        return twin

    def ensure_baseline(self, array: str) -> None:
        """The frozen baseline on `array`, once (baseline.json; before the array's first stack)."""
        if array not in self.baselines:
            self.baselines[array] = self.baseline(array)

    def baseline(self, array: str) -> dict:
        """Frozen features with cosine and L1: metrics and per-item values on dev and test (and OOD sets)."""
        X = self.features(array)[:, :self.store.dim]  # the first array (the last layer)
        out = {}
        for name, t in self.ood.items():
            res, _ = evaluate_split(t, transfer_split(t), embedder(None, X), ("cosine", "l1"))
            out[f"ood_{name}"] = {"metrics": res[0]}
        for split in ("dev", "test"):
            if split in self.task.eval_sets:
                res, items = evaluate_split(self.task, split, embedder(None, X), ("cosine", "l1"))
                out[split] = {"metrics": res[0], "items": {k: [float(x) for x in v] for k, v in items[0].items()}}
        return out

    def scored_task(self, train: TrainConfig) -> Task:
        """The task a stack trains on (the kind's `for_training`) with the split reported as test."""
        stask = kind_of(self.task).for_training(self.task, train)
        if self.score_split == "test":
            return stask
        if not train.shots:
            raise ValueError(f"score_split={self.score_split!r} is for few-shot heads (shots > 0), which select on nothing")
        report = kind_of(self.task).as_reported(self.task.eval_sets[self.score_split])
        return replace(stask, eval_sets={"test": report})

    def base_columns(self, stask: Task, array: str, key: tuple) -> dict:
        """`base_*`: the frozen baseline on the texts a stack trained on, when they differ from the dataset's
        (few-shot samples): every head is compared with the baseline that saw exactly its labels."""
        if stask is self.task:
            return {}
        if key not in self._base_rows:
            X = self.features(array)[:, :self.store.dim]
            res, _ = evaluate_split(stask, "test", embedder(None, X), ("cosine", "l1"))
            self._base_rows[key] = {f"base_{k}": v for k, v in res[0].items()}
        return self._base_rows[key]

    def train(self, items: list[tuple], array: str, progress: bool) -> list[dict]:
        """Train one stack, save it, and return its rows (the local engine)."""
        self.ensure_baseline(array)
        return self.save(self.compute(items, array, progress))

    def save(self, result: StackResult) -> list[dict]:
        """Write a stack's files (heads.artefacts.files.save_stack); its rows."""
        save_stack(self.out, result.stack, result.model, result.norm, result.head_ids, result.configs, result.array,
                   result.context)
        return result.rows

    def compute(self, items: list[tuple], array: str, progress: bool) -> StackResult:
        """Train one stack and score it: its weights and rows, nothing written."""
        X = self.features(array)
        configs = [it[2] for it in items]
        stask = self.scored_task(configs[0])
        head_cfg = head_shape(items[0][1], X, array, stask, configs[0], array_widths(self.store, array))  # a classifier head ends in the classes
        plan = resolve_stack(configs)  # the stack's settings, resolved once (heads.training.resolved)
        t0 = time.perf_counter()
        model, norm, runs = train_stack(stask, X, head_cfg, plan, progress=progress, selection=self.selection,
                                        anchor_rows=self.anchor_positions(configs[0]))
        t1 = time.perf_counter()
        scores, tested = self.score(stask, model, norm(X), plan.eval_energy, runs, configs)
        t2 = time.perf_counter()
        stack = items[0][0]
        base = self.base_columns(stask, array, (array, configs[0].shots, configs[0].seed if configs[0].shots else 0))
        extra = kind_of(stask).grid_columns(stask)
        rows = []
        for h, (hid, head, train, _) in enumerate(items):
            row = {"head_id": hid, "grid_version": GRID_VERSION, "stack": stack, "stack_index": h,
                   **flat_settings(head, train, array), "status": runs[h].status, "reason": runs[h].reason,
                   "best_epoch": runs[h].best_epoch, "train_seconds": (t1 - t0) / len(items),
                   "eval_seconds": (t2 - t1) / len(items), "history": json.dumps(runs[h].history), **extra}
            if plan.adjusts_strength:  # the a applied after training, and the dev curve it was chosen on
                row.update(strength_chosen=runs[h].strength, strength_curve=json.dumps(runs[h].strength_curve))
            row.update(dev_ranked=runs[h].dev_candidates.get("method", "exact") if runs[h].dev_candidates else "exact",
                       test_scored=h in tested, test_scope=self.test_scope)
            rows.append(row | self.score_columns(scores, h, stask, plan.eval_energy) | base)
        return StackResult(stack, [it[0] for it in items], configs, array, model, norm, self.stack_context(stask), rows)

    def score(self, stask: Task, model, Xn: torch.Tensor, energy: str, runs: list, configs: list) -> tuple[dict, set]:
        """({column prefix: (metrics per head, items per head)} on dev, test and the transfer sets, and the
        out-of-domain selection losses under "sel"; the heads scored on test). A stack whose dev was ranked on
        candidates (a corpus above exact_max, heads.kinds.ir.selection_set) reports that dev, and with
        test_scope "auto" ranks test exactly over the corpus for the heads of its dev-best configuration only
        (TEST_SCOPES)."""
        embed = embedder(model, Xn)
        cut = runs[0].select_set is not None and runs[0].dev_candidates.get("method") == "candidates"
        dev_task = replace(stask, eval_sets={**stask.eval_sets, "dev": runs[0].select_set}) if cut else stask
        scores = {"dev": evaluate_split(dev_task, "dev", embed, (energy,))} if "dev" in stask.eval_sets else {}
        for name, t in self.ood.items():
            scores[f"ood_{name}"] = evaluate_split(t, transfer_split(t), embed, (energy,))
        if self.selection:
            scores["sel"] = self.selection.losses(embed, energy)
        tested: set[int] = set()
        if "test" in stask.eval_sets:
            tested = heads_to_test(self.test_scope, cut, scores, runs, configs, kind_of(stask).primary_metric(energy),
                                   self.selection.delta if self.selection else 0.0)
            scores["test"] = scored_heads(stask, "test", model, Xn, energy, sorted(tested))
        order = ["dev", "test", *(f"ood_{name}" for name in self.ood), "sel"]  # the columns' order
        return {k: scores[k] for k in order if k in scores}, tested

    def score_columns(self, scores: dict, h: int, stask: Task, energy: str) -> dict:
        row = {"primary": kind_of(stask).primary_metric(energy)}
        for split, (per_head, per_item) in scores.items():
            if split == "sel" or per_head[h] is None:  # not scored (test: another configuration was selected)
                continue
            kind = kind_of(self.ood[split[4:]] if split.startswith("ood_") else stask)
            row.update({f"{split}_{k}": v for k, v in per_head[h].items()})
            row[f"{split}_primary"] = per_head[h][kind.primary_metric(energy)]
            row[f"{split}_items"] = json.dumps([float(x) for x in per_item[h][PREFIX[energy]]])
        if "sel" in scores:
            sel_loss, sel_sets = scores["sel"]
            row.update({f"sel_{n}_primary": float(v[h]) for n, v in sel_sets.items()})
            row["sel_loss"], row["sel_delta"] = float(sel_loss[h]), float(self.selection.delta)
        return row

    def stack_context(self, stask: Task) -> dict:
        """What a head needs to know of its dataset and store (train-head's config.json fields), per stack."""
        return {**self.context, "task": stask.name, "kind": stask.kind,
                "dev": stask.dev_note or "the dataset's dev split", "store_fingerprint": self.store.fingerprint,
                "store_manifest": {k: v for k, v in self.store.manifest.items() if k != "arrays"}, **label_space(stask)}
