"""bench/gpu/compare_config.py (the configs bench/gpu/compare.sh runs): the shipped compare configs with their
dataset paths under another root load as the same CompareConfig but for those paths; overrides replace, add
and remove keys; bench/gpu/compare_summary.py reads a compare.json back."""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from headstore.heads.experiments.compare.config import load_compare_config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
from compare_config import families, main, merged, rewrite_paths, run_config  # noqa: E402
from compare_summary import in_domain_table, split_line  # noqa: E402


@pytest.mark.parametrize("shipped", ["examples/compare.toml", "examples/compare-stsb.toml"])
def test_a_shipped_config_moved_to_another_datasets_root_is_the_same_run(tmp_path, shipped):
    data = tmp_path / "carried" / "datasets"
    out = tmp_path / "run.toml"
    out.write_text(run_config(str(ROOT / shipped), str(data)))
    moved, original = load_compare_config(str(out)), load_compare_config(str(ROOT / shipped))
    paths = [moved.in_domain, *moved.out_of_domain, moved.mlm_text]
    assert all(p.startswith(str(data) + "/") for p in paths)
    assert [Path(p).relative_to(data) for p in paths] == \
        [Path(p).relative_to("../shared/datasets") for p in [original.in_domain, *original.out_of_domain,
                                                              original.mlm_text]]
    same = dataclasses.replace(moved, in_domain=original.in_domain, out_of_domain=original.out_of_domain,
                               mlm_text=original.mlm_text)
    assert same == original  # every other setting as shipped


def test_overrides_replace_add_and_remove_keys(tmp_path):
    config = {"compare": {"seeds": [0, 1, 2], "n_boot": 1000}, "finetune": {"lr_grid": [0.5, 1.0, 2.0]}}
    over = {"compare": {"seeds": [0], "max_docs": 150, "n_boot": "unset"}, "mlm": {"probe_steps": 40}}
    assert merged(config, over) == {"compare": {"seeds": [0], "max_docs": 150},
                                    "finetune": {"lr_grid": [0.5, 1.0, 2.0]}, "mlm": {"probe_steps": 40}}
    assert config["compare"]["n_boot"] == 1000  # the input is left as it was
    assert rewrite_paths(["../shared/datasets/a", "x/../shared/datasets/b", 3], "/d") == \
        ["/d/a", "x/../shared/datasets/b", 3]
    with pytest.raises(ValueError, match="not a \\[section\\]"):
        merged(config, {"seeds": [0]})
    rehearsal = tmp_path / "r.toml"
    rehearsal.write_text(run_config(str(ROOT / "examples/compare.toml"), "/d",
                                    str(ROOT / "bench/gpu/compare_rehearsal.toml")))
    cfg = load_compare_config(str(rehearsal))
    assert cfg.seeds == (0, 1) and cfg.max_docs == 150 and cfg.finetune.max_steps == 6 and cfg.train.mined_k == 2
    assert cfg.lr_grid == (0.5, 1.0, 2.0) and cfg.head.out_dim == 384  # the rest as shipped


def test_the_families_are_the_tuned_encoders_of_the_rows(tmp_path):
    assert families(str(ROOT / "examples/compare.toml")) == ["adapted", "finetuned", "adapters", "lora"]
    some = tmp_path / "some.toml"
    some.write_text('[data]\nin_domain = "x"\n[compare]\nsetups = ["frozen-head", "lora-cosine", "adapted-head"]\n')
    assert families(str(some)) == ["adapted", "lora"]


def test_the_command_writes_toml_and_refuses_without_data(tmp_path, capsys):
    assert main([str(ROOT / "examples/compare.toml"), "--data", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    (tmp_path / "c.toml").write_text(text)
    assert load_compare_config(str(tmp_path / "c.toml")).in_domain == str(tmp_path / "scifact")
    with pytest.raises(SystemExit):
        main([str(ROOT / "examples/compare.toml")])


def test_the_summary_reads_the_in_domain_rows_and_the_split():
    row = lambda label, mean, diff: {  # noqa: E731
        "label": label, "seeds": [0, 1], "trainable_parameters": 1234, "seconds": 5.0,
        "datasets": {"scifact": {"metric": "manhattan_ndcg@10", "mean": mean, "std": 0.01,
                                 "ci": [mean - 0.1, mean + 0.1], **({"vs_frozen_head": diff} if diff else {})}}}
    result = {"rows": [row("frozen + head", 0.7, None),
                       row("LoRA + head", 0.75, {"diff": 0.05, "ci": [0.01, 0.09], "excludes_zero": True})]}
    lines = in_domain_table(json.loads(json.dumps(result)))
    assert "scifact (in domain)" in lines[0] and len(lines) == 4
    assert "| frozen + head | 2 | manhattan_ndcg@10 0.7000 ± 0.0100 [0.6000, 0.8000] | (reference) | 1,234 | 5 |" \
        == lines[2]
    assert "+0.0500 [+0.0100, +0.0900] *" in lines[3]
    assert split_line({"stores": 30.0, "tuning": 90.0}) == "time split (compare.json time_split_seconds, every " \
        "step as it ran): 120 s = tuning 90 s (75%), stores 30 s (25%)"
