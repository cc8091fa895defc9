"""cli compare end to end on a tiny random BERT with tiny BEIR / STS data: every setup row, resume."""
import json

import pytest
from click.testing import CliRunner

from headstore.cli import main
from headstore.heads.experiments.compare.run import load_compare_config

from .finetune_world import sentence, tiny_beir, tiny_bert, tiny_sts
from .compare_world import TINY_HEAD, tiny_featurize, write_compare_toml


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    import random

    root = tmp_path_factory.mktemp("cmp")
    model = tiny_bert(root / "model", layers=2)
    ind = tiny_beir(root / "in-domain", seed=0)
    ood = tiny_beir(root / "ood-ir", seed=1, n_docs=30, n_train=0, n_test=10)
    sts = tiny_sts(root / "ood-sts.parquet", seed=2)
    rng = random.Random(3)
    (root / "general.txt").write_text("\n".join(sentence(rng, 20) for _ in range(20)) + "\n")
    cfg = root / "compare.toml"
    write_compare_toml(cfg, {
        "data": {"in_domain": ind, "out_of_domain": [ood, sts], "mlm_text": root / "general.txt", "mlm_text_split": ""},
        "featurize": tiny_featurize(model),
        "head": {**TINY_HEAD, "normalize": "none", "impostors": "all", "mined_k": 0, "epochs": 2},
        "adapt": {"max_steps": 3, "batch_size": 4, "max_length": 16, "device": "cpu"},
        "finetune": {"max_steps": 2, "device": "cpu", "encoder_lr": 1e-3, "keep": "last"},
        "mlm": {"max_texts": 8, "holdout_fraction": 0.2},
        "compare": {"seeds": [0, 1], "n_boot": 200, "setups": [
            "frozen-cosine", "frozen-head", "adapted-cosine", "adapted-head", "finetuned-cosine", "finetuned-head"]}})
    return root, cfg


def test_compare_writes_every_setup_row_over_seeds_and_resumes(world):
    root, cfg = world
    out = root / "out"
    r = CliRunner().invoke(main, ["compare", "--config", str(cfg), "--out", str(out)])
    assert r.exit_code == 0, r.output
    result = json.loads((out / "compare.json").read_text())
    by = {row["setup"]: row for row in result["rows"]}
    assert list(by) == ["frozen-cosine", "frozen-head", "adapted-cosine", "adapted-head", "finetuned-cosine",
                        "finetuned-head"]
    assert by["frozen-head"]["seeds"] == [0, 1] and by["finetuned-head"]["seeds"] == [0, 1]
    assert by["frozen-cosine"]["seeds"] == [0]  # the frozen encoder's cosine is the same at every seed
    for row in result["rows"]:
        assert set(row["datasets"]) == {"in-domain", "ood-ir", "ood-sts"}
        ind = row["datasets"]["in-domain"]
        assert ind["metric"].endswith("ndcg@10") and len(ind["per_seed"]) == len(row["seeds"])
        assert ind["mean"] == pytest.approx(sum(ind["per_seed"]) / len(ind["per_seed"]))
        assert ind["ci"][0] <= ind["mean"] <= ind["ci"][1]
        assert row["datasets"]["ood-sts"]["metric"].startswith("spearman_")
        assert row["seconds"] > 0 and row["peak_mb"] > 0
        assert set(row["mlm_loss"]) >= {"general", "in_domain"}
        assert (row["setup"] == "frozen-head") == ("vs_frozen_head" not in ind)
    # two seeds of frozen + head: different heads, so a spread
    assert len(set(by["frozen-head"]["datasets"]["in-domain"]["per_seed"])) == 2
    assert by["frozen-head"]["trainable_parameters"] > 0 == by["frozen-cosine"]["trainable_parameters"]
    assert by["finetuned-head"]["trainable_parameters"] > by["frozen-head"]["trainable_parameters"]
    # the fine-tuned encoder changed the features and what the probe MLM head decodes
    frozen, tuned = by["frozen-cosine"], by["finetuned-cosine"]
    assert frozen["datasets"]["ood-sts"]["mean"] != tuned["datasets"]["ood-sts"]["mean"]
    assert tuned["mlm_loss"]["general"]["mean"] != frozen["mlm_loss"]["general"]["mean"]
    md = (out / "compare.md").read_text()
    assert all(row["label"] in md for row in result["rows"]) and "Paired difference" in md
    assert (out / "compare.png").stat().st_size > 10_000
    # rerun: every step is reused, the table is the same
    r = CliRunner().invoke(main, ["compare", "--config", str(cfg), "--out", str(out)])
    assert r.exit_code == 0 and "running" not in r.output, r.output
    assert json.loads((out / "compare.json").read_text())["rows"] == result["rows"]


def test_a_changed_setting_reruns_only_what_depends_on_it(world):
    root, cfg = world
    out = root / "out"
    if not (out / "compare.json").is_file():
        pytest.skip("needs the end-to-end run")
    r = CliRunner().invoke(main, ["compare", "--config", str(cfg), "--out", str(out), "--finetune-steps", "1"])
    assert r.exit_code == 0, r.output
    ran = {line.split(":")[0].split()[-1] for line in r.output.splitlines() if ": running" in line}
    candidates = {f"finetuned-s0-lr{lr:g}" for lr in (5e-4, 1e-3, 2e-3)}  # the lr grid around 1e-3, at seed 0
    assert ran == {f"{step}-s{s}" for s in (0, 1) for step in ("featurize-finetuned", "mlm-finetuned")} \
        | {"finetuned-s1"} | candidates \
        | {f"eval-finetuned-s{s}-{d}" for s in (0, 1) for d in ("in-domain", "ood-ir", "ood-sts")}


def test_an_interrupted_compare_resumes_where_it_stopped(world, monkeypatch):
    """A step that dies (here: seed 1's fine-tuning) leaves every finished step's record; the rerun does
    only what is left."""
    import headstore.heads.apply.finetune as ft

    root, cfg = world
    out = root / "out-interrupted"
    real = ft.finetune

    def dies_at_seed_1(head_dir, out_dir, fcfg, *args, **kwargs):
        if fcfg.seed == 1:
            raise KeyboardInterrupt
        return real(head_dir, out_dir, fcfg, *args, **kwargs)

    monkeypatch.setattr(ft, "finetune", dies_at_seed_1)
    r = CliRunner().invoke(main, ["compare", "--config", str(cfg), "--out", str(out), "--setups",
                                  "frozen-head,finetuned-head", "--no-mlm"])
    assert r.exit_code != 0 and not (out / "compare.json").exists()
    monkeypatch.setattr(ft, "finetune", real)
    r = CliRunner().invoke(main, ["compare", "--config", str(cfg), "--out", str(out), "--setups",
                                  "frozen-head,finetuned-head", "--no-mlm"])
    assert r.exit_code == 0, r.output
    ran = {line.split(":")[0].split()[-1] for line in r.output.splitlines() if ": running" in line}
    assert {name for name in ran if not name.startswith("eval-")} == {"finetuned-s1", "featurize-finetuned-s1"}


def test_a_missing_general_text_is_said_not_dropped(world, tmp_path, monkeypatch):
    root, cfg = world
    out = root / "out"
    if not (out / "compare.json").is_file():
        pytest.skip("needs the end-to-end run")
    monkeypatch.setenv("HEADSTORE_DATA", str(tmp_path))  # a root without wikitext-2
    no_text = root / "compare-no-text.toml"
    no_text.write_text("\n".join(line for line in cfg.read_text().splitlines() if not line.startswith("mlm_text")))
    r = CliRunner().invoke(main, ["compare", "--config", str(no_text), "--out", str(out)])
    assert r.exit_code == 0, r.output
    looked_for = str(tmp_path / "wikitext-2" / "wikitext2.parquet")
    warnings = [line for line in r.output.splitlines() if "WARNING" in line]
    assert len(warnings) == 2 and all(looked_for in line for line in warnings), r.output  # before and after
    rows = json.loads((out / "compare.json").read_text())["rows"]
    assert all("general" not in row["mlm_loss"] and "in_domain" in row["mlm_loss"] for row in rows)


def test_datasets_root_is_the_tests_root(tmp_path, monkeypatch):
    from pathlib import Path

    from headstore.heads.experiments.compare.run import CompareConfig
    from headstore.heads.experiments.compare.datasets_root import datasets_root, missing_mlm_text_note
    from headstore.heads.experiments.compare.forgetting import ForgettingConfig

    monkeypatch.delenv("HEADSTORE_DATA", raising=False)  # conftest's real_dataset: <repo>/../shared/datasets
    assert datasets_root() == Path(__file__).resolve().parents[2].parent / "shared" / "datasets"
    monkeypatch.setenv("HEADSTORE_DATA", str(tmp_path))
    text = tmp_path / "wikitext-2" / "wikitext2.parquet"
    assert datasets_root() == tmp_path and CompareConfig(in_domain="x").mlm_text is None
    assert str(text) in missing_mlm_text_note(True, None)
    assert missing_mlm_text_note(False, None) is None and missing_mlm_text_note(True, "t.txt") is None
    text.parent.mkdir()
    text.write_bytes(b"")
    assert CompareConfig(in_domain="x").mlm_text == str(text)
    assert ForgettingConfig(task_a="a", task_b="b", store="s").mlm_text == str(text)


def test_config_errors_name_the_valid_settings(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[data]\nin_domain = "x"\n[finetune]\nunfreez = "all"\n')
    with pytest.raises(ValueError, match="unfreeze"):
        load_compare_config(str(bad))
    with pytest.raises(ValueError, match="in-domain"):
        load_compare_config(None)


def test_default_mlm_text_is_the_shared_wikitext_file(real_dataset):
    """Without mlm_text, compare and forgetting take wikitext-2 from the datasets root the tests use
    ($HEADSTORE_DATA, else <repo>/../shared/datasets). compare once looked one folder too high (inside
    the repository), found nothing and dropped the general-MLM column without a word."""
    from headstore.heads.experiments.compare.run import CompareConfig
    from headstore.heads.experiments.compare.forgetting import ForgettingConfig

    expected = str(real_dataset("wikitext-2") / "wikitext2.parquet")
    assert CompareConfig(in_domain="x").mlm_text == expected
    assert ForgettingConfig(task_a="a", task_b="b", store="s").mlm_text == expected
