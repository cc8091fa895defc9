"""`cli forgetting`: train on task A, then on task B, and measure what A loses — five ways.

1. frozen encoder + one head per task: head A never changes, so A's score after B is A's score
   before B, exactly (no forgetting by construction; the table shows it, it is not assumed);
2. frozen encoder + one shared head, trained on A, then trained on from A's weights on B
   (`train_stack(init=...)`); A is scored with that head after B;
3. encoder fine-tuned end to end (`cli finetune` machinery): encoder + head A on A, then a head
   for B trained on the A-tuned encoder's features and encoder + that head fine-tuned on B; A is
   scored with A's fine-tuned head on the features of the encoder after B;
4. bottleneck adapters (`cli finetune --setup adapters`), one set + head per task on the frozen base: the
   adapter way of learning a second task. A's adapters never see B, so A's score after B is its score before
   (measured, like row 1); what the row adds is B's score and the MLM loss of the encoder with A's adapters;
5. LoRA (`--setup lora`, merged into the weights) on A, then LoRA on B over the merged encoder, exactly as
   row 3: how much of fine-tuning's forgetting the low-rank update keeps.
Rows 3-5 are `tunings` (full, adapters, lora); adapters and LoRA train at their own rate (heads.apply.tunings).
Each row: A before, A after B, forgetting = before - after, B's own score, and the encoder's MLM
loss before / after (masked-token cross-entropy on held-out wikitext-2 lines under a probe MLM head
trained on the frozen base encoder: `cli adapt --head-only`; rows 1 and 2 keep the base encoder).
Scores are each task's primary test metric (k-NN accuracy under the head's energy for labelled
texts, Spearman for STS, nDCG@10 for IR).

`split_classes` makes the 20 Newsgroups pair: the labelled dataset's classes (sorted) split into two
disjoint halves, A the first and B the second, with `train_per_class` / `test_per_class` texts per
class drawn with a seed (full 20 Newsgroups re-featurized twice would take hours on a CPU), written
as two Parquet files under the output folder. Every step is cached by its key (`compare.Steps`; data/keys.py:
the resolved settings, the recipe version, the datasets' contents).
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from headstore.data.dataset import load_dataset
from headstore.data.files import atomic_write_json, atomic_write_text
from headstore.data.keys import content_digest, resolved
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.run.local import featurize
from headstore.featurize.store.reader import FeatureStore
from headstore.featurize.encoder.config import AdaptConfig
from headstore.featurize.tuning.adapt import adapt
from headstore.heads.apply.finetune import FinetuneConfig, finetune
from headstore.featurize.tuning.mlm_eval import mlm_loss
from headstore.featurize.tuning.packing import load_texts, split_holdout
from headstore.heads.artefacts.files import write_head_dir
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.experiments.compare.run import Steps
from headstore.heads.experiments.compare.report import GENERAL_MIN_CHARS, with_head
from headstore.heads.experiments.compare.setups import model_key
from headstore.heads.experiments.compare.datasets_root import default_mlm_text, missing_mlm_text_note
from headstore.heads.network.features import load_features
from headstore.heads.kinds import for_training, load_task
from headstore.heads.kinds.labels import few_shot_indices
from headstore.heads.evaluation.evaluate import evaluate_head
from headstore.heads.training.run import load_head, train_head
from headstore.heads.training.train import train_stack


# the head settings the forgetting tables were measured with (docs/labels.md), pinned so that later changes
# of train-head's defaults (docs/l1-energy.md round 2: lr 3e-3, re-mining, the pearson graded form) do not
# move them: every head of the test trains the same way on labels, STS and IR
FORGETTING_TRAIN = {"lr": 1e-3, "remine": False, "graded": "weight"}


# encoder tunings (rows 3-5): label, step-name prefix, and how task B meets task A's encoder
TUNING_ROWS = {
    "full": ("encoder fine-tuned on A, then on B", "", "sequential"),
    "adapters": ("adapters, one set per task (base frozen)", "adapters-", "per-task"),
    "lora": ("LoRA on A (merged), then LoRA on B", "lora-", "sequential"),
}


def _tuning_config(finetune: FinetuneConfig, tuning: str) -> FinetuneConfig:
    """The [finetune] settings for one tuning: full fine-tuning keeps the given encoder lr; adapters and LoRA
    take their own (heads.apply.tunings: their weights start at the identity and need a far higher rate). Each
    trains one epoch (unless max_epochs says) and keeps its last state: what that training does to task A (cli
    finetune's default keeps the best dev epoch, which may be the start, and would hide the forgetting)."""
    finetune = dataclasses.replace(finetune, max_epochs=finetune.max_epochs or 1, keep="last")
    if tuning == "full":
        return dataclasses.replace(finetune, setup="full")
    return dataclasses.replace(finetune, setup=tuning, encoder_lr=None)


@dataclass(frozen=True)
class ForgettingConfig:
    task_a: str  # dataset trained first (its test split is the forgetting measure)
    task_b: str  # dataset trained second
    store: str  # base-encoder features of both tasks' texts
    format_a: str | None = None
    format_b: str | None = None
    model: str = "minilm"  # the encoder the store was featurized with
    head: HeadConfig = HeadConfig()
    train: TrainConfig = TrainConfig(**FORGETTING_TRAIN)  # both tasks' heads (l1-energy: labels, STS, IR alike)
    finetune: FinetuneConfig = FinetuneConfig(mined_k=0)  # mined negatives x encoder passes: too dear on CPU
    featurize: FeaturizeConfig = FeaturizeConfig()  # re-featurizing after each fine-tune (its model is replaced)
    mlm: bool = True  # MLM loss of the encoder before / after
    mlm_text: str | None = field(default_factory=default_mlm_text)  # wikitext-2 under the datasets root
    mlm_probe_steps: int = 50  # steps of the probe MLM head on the frozen base encoder
    mlm_max_texts: int = 64  # held-out texts scored (~1 minute per encoder on 2 CPU cores)
    mlm_holdout_fraction: float = 0.02  # wikitext texts kept out of the probe's training, scored
    mlm_max_length: int = 128  # tokens per packed block (probe training and scoring)
    tunings: tuple[str, ...] = tuple(TUNING_ROWS)  # the encoder-tuning rows (3, 4, 5): full, adapters, lora


def split_classes(data: str, data_format: str | None, out_dir: str | Path, train_per_class: int = 64,
                  test_per_class: int = 100, seed: int = 0) -> tuple[str, str]:
    """Two labelled Parquet files (A, B) from one labelled dataset: disjoint halves of its classes."""
    ds = load_dataset(data, data_format or "labels")
    if ds.kind != "labels":
        raise ValueError(f"{data}: split_classes needs labelled texts (--format labels), got {ds.kind!r}")
    frame = ds.frame.select("text", "label", "split")
    names = sorted(set(frame.filter(pl.col("split") == "train")["label"].to_list()))
    if len(names) < 4:
        raise ValueError(f"{data}: {len(names)} classes; two halves need at least 4")
    halves = {"A": names[:len(names) // 2], "B": names[len(names) // 2:]}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for tag, labels in halves.items():
        parts = []
        for split, n in (("train", train_per_class), ("test", test_per_class)):
            f = frame.filter((pl.col("split") == split) & pl.col("label").is_in(labels))
            classes = np.array([labels.index(x) for x in f["label"].to_list()])
            parts.append(f[few_shot_indices(classes, n, seed).tolist()])
        path = out / f"{Path(str(data)).stem}-{tag}.parquet"
        pl.concat(parts).write_parquet(path)
        paths.append(str(path))
    return paths[0], paths[1]


def _score(store_path, head_dir, data, data_format, train_cfg: TrainConfig, task_split: str = "test") -> dict:
    """A head's primary metric on a dataset's test split, on any store holding its texts.

    Unlike `cli eval`, the store may come from another encoder than the head's: measuring that
    mismatch (A's head on the encoder after B) is the point here."""
    store = FeatureStore.open(str(store_path))
    model, norm, _ = load_head(str(head_dir))
    task = for_training(load_task(str(data), store, data_format), train_cfg)
    metrics = evaluate_head(task, load_features(store), model, norm, train_cfg.eval_energy, (task_split,))
    return {"metric": metrics["primary"], "value": float(metrics["head"][metrics["primary"]]),
            "baseline": float(metrics["baseline"][metrics["baseline_primary"]]), "baseline_metric": metrics["baseline_primary"]}


def _continue_head(cfg: ForgettingConfig, head_dir: Path, data: str, data_format, out: Path) -> dict:
    """Setup 2: head A trained on from its weights on B (frozen features); writes a head directory."""
    model, norm, config = load_head(str(head_dir))
    store = FeatureStore.open(cfg.store)
    task = for_training(load_task(data, store, data_format), cfg.train)
    trained, norm, (run,) = train_stack(task, load_features(store), model.cfg, [cfg.train], init=(model, norm))
    if run.status != "ok":
        raise RuntimeError(f"shared head on {data}: {run.reason}")
    write_head_dir(out, trained, norm, {**config, "data": data, "format": data_format,
                                        "continued_from": str(head_dir), "best_epoch": run.best_epoch})
    return {"best_epoch": run.best_epoch}


class ForgettingSteps:
    """The steps of one forgetting run, each cached by its key (`compare.Steps`): the heads and their scores,
    the stores featurized with a tuned encoder, and the two ways an encoder tuning meets task B (`TUNING_ROWS`)."""

    def __init__(self, cfg: ForgettingConfig, steps: Steps):
        self.cfg, self.steps = cfg, steps
        self.tasks = {"A": (cfg.task_a, cfg.format_a), "B": (cfg.task_b, cfg.format_b)}
        self.contents = {tag: [content_digest(d, f"task_{tag.lower()}"), f] for tag, (d, f) in self.tasks.items()}
        steps.register(cfg.store, FeatureStore.open(cfg.store).fingerprint)  # the given store: by what made it
        self.common = {"store": steps.key_of(cfg.store), "head": resolved(cfg.head), "train": resolved(cfg.train)}
        self.head_a, self.head_b = self.head("head-A", "A", cfg.store), self.head("head-B", "B", cfg.store)

    def head(self, name: str, tag: str, store, extra=None) -> Path:
        """A head trained on task `tag`'s texts in `store` (train-head with the run's settings)."""
        cfg, (data, fmt) = self.cfg, self.tasks[tag]
        settings = {**self.common, "store": self.steps.key_of(store), "data": self.contents[tag], **(extra or {})}
        folder, _ = self.steps.run(name, settings, lambda d: {"primary": train_head(
            str(store), data, str(d / "head"), cfg.head, cfg.train, fmt, progress=False)["primary"]}, "train-head")
        return folder / "head"

    def score(self, store, head, tag: str) -> dict:
        return _score(store, head, self.tasks[tag][0], self.tasks[tag][1], self.cfg.train)

    def frozen_rows(self) -> list[dict]:
        """Rows 1 (one head per task) and 2 (one shared head: A, then on from A's weights on B)."""
        cfg, store, head_a = self.cfg, self.cfg.store, self.head_a
        a_before = self.score(store, head_a, "A")
        rows = [{"setup": "1: frozen encoder + per-task heads", "A_before": a_before,
                 "A_after": self.score(store, head_a, "A"), "B": self.score(store, self.head_b, "B"),
                 "encoder_after": "base"}]
        shared, _ = self.steps.run("shared-head-AB", {**self.common, "from": self.steps.key_of(head_a),
                                                      "data": self.contents["B"]},
                                   lambda d: _continue_head(cfg, head_a, cfg.task_b, cfg.format_b, d / "head"),
                                   "train-head")
        rows.append({"setup": "2: frozen encoder + shared head (A then B)", "A_before": a_before,
                     "A_after": self.score(store, shared / "head", "A"), "B": self.score(store, shared / "head", "B"),
                     "encoder_after": "base"})
        return rows

    def featurized(self, name: str, encoder, key: dict) -> Path:
        """Both tasks' texts featurized with `encoder` (a tuned encoder folder): the store."""
        tasks = self.tasks
        fcfg = dataclasses.replace(self.cfg.featurize, model=str(encoder))
        settings = {"encoder": key, "featurize": {k: v for k, v in resolved(fcfg).items() if k != "model"},
                    "data": list(self.contents.values())}
        folder, _ = self.steps.run(name, settings,
                                   lambda d: {"n_encoded": featurize(fcfg, [t[0] for t in tasks.values()], d / "store",
                                                                     [t[1] for t in tasks.values()])["n_encoded"]},
                                   "featurize")
        return folder / "store"

    def sequential(self, prefix: str, fcfg: FinetuneConfig):
        """Encoder (+ head) tuned on A, a head for B on its features, encoder + that head tuned on B: the stores
        and tuned folders; `prefix` names the steps ("" keeps the fine-tuning steps' first names)."""
        cfg, head_a = self.cfg, self.head_a
        key, of = {**self.common, "finetune": resolved(fcfg)}, self.steps.key_of
        tag = prefix or "finetune-"
        ft_a, _ = self.steps.run(f"{tag}A", {**key, "head": of(head_a), "data": self.contents["A"]},
                                 lambda d: _ft(finetune(str(head_a), str(d), fcfg, cfg.store, cfg.task_a, cfg.model)),
                                 "finetune")
        store_a = self.featurized(f"featurize-{prefix}A", ft_a / "encoder", {f"{tag}A": of(ft_a)})
        head_b_on_a = self.head(f"head-B-on-{prefix}A", "B", store_a, {"encoder": of(ft_a)})
        ft_ab, _ = self.steps.run(f"{tag}AB", {**key, "head": of(head_b_on_a), "data": self.contents["B"]},
                                  lambda d: _ft(finetune(str(head_b_on_a), str(d), fcfg, str(store_a), cfg.task_b,
                                                         str(ft_a / "encoder"))), "finetune")
        store_ab = self.featurized(f"featurize-{prefix}AB", ft_ab / "encoder", {f"{tag}AB": of(ft_ab)})
        return {"A_before": self.score(store_a, ft_a / "head", "A"),
                "A_after": self.score(store_ab, ft_a / "head", "A"),
                "B": self.score(store_ab, ft_ab / "head", "B")}, ft_a / "encoder", ft_ab / "encoder"

    def per_task(self, prefix: str, fcfg: FinetuneConfig):
        """A tuning that keeps the base weights, one per task (adapters): A's set never sees B."""
        cfg, tasks = self.cfg, self.tasks
        key = {**self.common, "finetune": resolved(fcfg)}
        tuned = {}
        for tag, head in (("A", self.head_a), ("B", self.head_b)):
            folder, _ = self.steps.run(f"{prefix}{tag}", {**key, "head": self.steps.key_of(head),
                                                          "data": self.contents[tag]},
                                       lambda d, head=head, tag=tag: _ft(finetune(str(head), str(d), fcfg, cfg.store,
                                                                                  tasks[tag][0], cfg.model)), "finetune")
            tuned[tag] = (folder, self.featurized(f"featurize-{prefix}{tag}", folder / "encoder",
                                                  {f"{prefix}{tag}": self.steps.key_of(folder)}))
        (fa, sa), (fb, sb) = tuned["A"], tuned["B"]
        return {"A_before": self.score(sa, fa / "head", "A"), "A_after": self.score(sa, fa / "head", "A"),
                "B": self.score(sb, fb / "head", "B")}, fa / "encoder", fa / "encoder"


def run_forgetting(cfg: ForgettingConfig, out_dir: str, log=print) -> str:
    """Run (or reuse) every step; write forgetting.json and forgetting.md; return the table."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "config.json", asdict(cfg), indent=1)
    steps = Steps(out, log)
    missing = missing_mlm_text_note(cfg.mlm, cfg.mlm_text)
    if missing:  # said now and in the table's notes, never dropped silently
        log(f"[forgetting] WARNING: {missing}")
    run = ForgettingSteps(cfg, steps)
    rows = run.frozen_rows()  # 1 and 2: the frozen encoder
    encoders = {"base": None}
    for n, tuning in enumerate(cfg.tunings, start=3):  # 3, 4, 5: the encoder tuned (TUNING_ROWS)
        if tuning not in TUNING_ROWS:
            raise ValueError(f"tunings: unknown {tuning!r}; valid: {list(TUNING_ROWS)}")
        label, prefix, how = TUNING_ROWS[tuning]
        fcfg = _tuning_config(cfg.finetune, tuning)
        scores, before, after = (run.sequential if how == "sequential" else run.per_task)(prefix, fcfg)
        name = prefix.rstrip("-") or "finetuned"
        encoders[f"{name}-A"], encoders[f"{name}-{'AB' if how == 'sequential' else 'A'}"] = before, after
        rows.append({"setup": f"{n}: {label}", **scores, "encoder_before": f"{name}-A",
                     "encoder_after": f"{name}-{'AB' if how == 'sequential' else 'A'}"})
    mlm = _mlm_losses(cfg, steps, encoders) if cfg.mlm and cfg.mlm_text else {}
    for row in rows:
        row["forgetting"] = row["A_before"]["value"] - row["A_after"]["value"]
        row["mlm_before"] = mlm.get(row.pop("encoder_before", "base"))
        row["mlm_after"] = mlm.get(row["encoder_after"])
    return _report(cfg, out, rows, mlm, steps.seconds)


def _ft(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k in ("steps", "first_loss", "last_loss_mean10", "seconds", "n_pairs")}


def _mlm_losses(cfg: ForgettingConfig, steps, encoders: dict) -> dict:
    """{encoder: MLM loss} on the same held-out wikitext lines and masks, under one probe MLM head."""
    probe_cfg = AdaptConfig(model=cfg.model, train_encoder=False, max_steps=cfg.mlm_probe_steps, batch_size=16,
                            holdout_fraction=cfg.mlm_holdout_fraction, max_length=cfg.mlm_max_length)
    text = content_digest(cfg.mlm_text, "mlm_text")
    probe, _ = steps.run("mlm-probe", {"adapt": {k: v for k, v in resolved(probe_cfg).items() if k != "model"},
                                       "model": model_key(cfg.model), "text": text},
                         lambda d: {k: v for k, v in adapt(probe_cfg, [cfg.mlm_text], d / "model").items()
                                    if k in ("steps", "last_loss_mean10", "mlm_head")}, "adapt")
    probe = probe / "model"
    _, held = split_holdout(load_texts(cfg.mlm_text), cfg.mlm_holdout_fraction)
    texts = [t for t in held if len(t) >= GENERAL_MIN_CHARS][:cfg.mlm_max_texts]
    out = {}
    for name, encoder in encoders.items():
        scored = probe if encoder is None else with_head(Path(encoder), probe, steps.out / f"mlm-{name}-model")
        settings = {"model": None if encoder is None else steps.key_of(encoder), "probe": steps.key_of(probe),
                    "n": len(texts), "text": text}
        _, res = steps.run(f"mlm-{name}", settings,
                           lambda d, scored=scored: {"mlm_loss": mlm_loss(str(scored), texts, max_length=cfg.mlm_max_length, seed=0,
                                                                          n_masks=2, progress=False)["mlm_loss"]},
                           "mlm-loss")
        out[name] = res["mlm_loss"]
    return out


def _report(cfg: ForgettingConfig, out: Path, rows: list[dict], mlm: dict, seconds: dict) -> str:
    a, b = Path(cfg.task_a).stem, Path(cfg.task_b).stem
    metric_a, metric_b = rows[0]["A_before"]["metric"], rows[0]["B"]["metric"]
    lines = [f"| setup | {a} before ({metric_a}) | {a} after {b} | forgetting | {b} ({metric_b}) | MLM loss before | MLM loss after |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        fmt = lambda v: "-" if v is None else f"{v:.3f}"
        lines.append(f"| {r['setup']} | {r['A_before']['value']:.4f} | {r['A_after']['value']:.4f} | "
                     f"{r['forgetting']:+.4f} | {r['B']['value']:.4f} | {fmt(r['mlm_before'])} | {fmt(r['mlm_after'])} |")
    notes = ["", f"A = {cfg.task_a}, B = {cfg.task_b}; frozen baseline (no head, cosine) on A: "
             f"{rows[0]['A_before']['baseline']:.4f} ({rows[0]['A_before']['baseline_metric']}), on B: "
             f"{rows[0]['B']['baseline']:.4f}. forgetting = A before - A after (positive = lost).",
             "MLM loss: masked-token cross-entropy on held-out wikitext-2 lines, one probe MLM head trained on the "
             "frozen base encoder, same masks for every encoder. Steps (s): "
             + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items())]
    missing = missing_mlm_text_note(cfg.mlm, cfg.mlm_text)
    if missing:
        notes.append(f"WARNING: {missing}.")
    table = "\n".join(lines + notes)
    atomic_write_text(out / "forgetting.md", f"# forgetting: {a} then {b}\n\n{table}\n")
    atomic_write_json(out / "forgetting.json", {"rows": rows, "mlm": mlm, "step_seconds": seconds}, indent=1)
    return table
