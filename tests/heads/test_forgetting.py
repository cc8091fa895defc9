"""The forgetting test on a tiny random BERT: task A (four topics), then task B (random labels).

Frozen encoder + per-task heads, and per-task adapters, must lose nothing on A (by construction, and
measured); fine-tuning the encoder on A and then on B must lose some of A; LoRA on A then B moves A's score."""
import dataclasses
import json

import pytest

from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.run.local import featurize
from headstore.heads.apply.finetune import FinetuneConfig
from headstore.heads.settings.config import TrainConfig
from headstore.heads.experiments.compare.forgetting import ForgettingConfig, run_forgetting, split_classes
from headstore.heads.settings.config import HeadConfig

from .finetune_world import tiny_bert
from .label_world import topic_texts


def test_forgetting_zero_for_frozen_per_task_heads_and_positive_for_sequential_finetune(tmp_path):
    model = tiny_bert(tmp_path / "model", layers=2)
    task_a, task_b = topic_texts(tmp_path, topic_words=2)
    mlm_text = tmp_path / "general.txt"
    mlm_text.write_text("\n".join(f"alpha beta gamma delta epsilon zeta theta kappa river tree stone {i} " * 3
                                  for i in range(60)))
    fcfg = FeaturizeConfig(model=str(model), dtype="float32", batch_tokens=2048)
    featurize(fcfg, [str(task_a), str(task_b)], tmp_path / "store")
    cfg = ForgettingConfig(task_a=str(task_a), task_b=str(task_b), store=str(tmp_path / "store"), model=str(model),
                           head=HeadConfig(hidden=16, out_dim=8, residual=False),
                           train=TrainConfig(loss="supcon-kl", epochs=3, batch_size=16),
                           finetune=FinetuneConfig(device="cpu", encoder_lr=1e-2, mined_k=0, batch_size=8),
                           featurize=fcfg, mlm_text=str(mlm_text), mlm_probe_steps=2, mlm_max_texts=8,
                           mlm_max_length=32, mlm_holdout_fraction=0.3)
    table = run_forgetting(cfg, str(tmp_path / "out"), log=lambda *a: None)
    rows = json.loads((tmp_path / "out" / "forgetting.json").read_text())["rows"]
    frozen, shared, tuned, adapters, lora = rows
    assert frozen["forgetting"] == 0.0 and frozen["A_before"] == frozen["A_after"]
    assert frozen["mlm_before"] == frozen["mlm_after"] == shared["mlm_after"]  # the encoder never moved
    assert tuned["forgetting"] > 0, table
    assert tuned["mlm_after"] != tuned["mlm_before"]
    # adapters, one set per task: A's set never sees B (measured again, not assumed); the adapters moved the
    # encoder's MLM loss away from the base's (scored with them attached)
    assert adapters["forgetting"] == 0.0 and adapters["A_before"] == adapters["A_after"]
    assert adapters["mlm_after"] != frozen["mlm_after"]
    # LoRA on A then on B: the merged encoder moved on B (its MLM loss changed)
    assert lora["mlm_after"] != lora["mlm_before"] and lora["A_after"]["metric"] == "manhattan_knn_accuracy"
    assert "| 4: adapters, one set per task" in table and "| 5: LoRA on A (merged), then LoRA on B" in table
    assert frozen["A_before"]["metric"] == "manhattan_knn_accuracy" and "| 3: encoder fine-tuned" in table
    # a rerun reuses every finished step
    assert run_forgetting(cfg, str(tmp_path / "out"), log=lambda *a: None) == table


def test_split_classes_gives_disjoint_halves(tmp_path):
    import polars as pl

    path = tmp_path / "l.parquet"
    pl.DataFrame({"body": [f"t{i}" for i in range(80)], "label": [f"g{i % 8}" for i in range(80)],
                  "split": ["train"] * 48 + ["test"] * 32}).write_parquet(path)
    a, b = split_classes(str(path), "labels?text_column=body", tmp_path / "out", train_per_class=3, test_per_class=2)
    fa, fb = pl.read_parquet(a), pl.read_parquet(b)
    assert set(fa["label"]) == {"g0", "g1", "g2", "g3"} and set(fb["label"]) == {"g4", "g5", "g6", "g7"}
    assert fa.filter(pl.col("split") == "train").height == 12 and fa.filter(pl.col("split") == "test").height == 8
    with pytest.raises(ValueError, match="at least 4"):
        pl.DataFrame({"text": ["a", "b"], "label": ["x", "y"]}).write_parquet(tmp_path / "two.parquet")
        split_classes(str(tmp_path / "two.parquet"), None, tmp_path / "o2")


def test_a_missing_general_text_is_said_in_the_table(tmp_path):
    from headstore.heads.experiments.compare.forgetting import _report

    score = {"metric": "m", "value": 0.5, "baseline": 0.4, "baseline_metric": "m"}
    row = {"setup": "1", "A_before": score, "A_after": score, "B": score, "forgetting": 0.0,
           "mlm_before": None, "mlm_after": None}
    cfg = ForgettingConfig(task_a="a", task_b="b", store="s", mlm_text=None)
    table = _report(cfg, tmp_path, [row], {}, {})
    assert "WARNING: no general MLM text" in table and "wikitext2.parquet" in table
    assert "WARNING" not in _report(dataclasses.replace(cfg, mlm=False), tmp_path, [row], {}, {})
