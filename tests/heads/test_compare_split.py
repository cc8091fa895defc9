"""A compare table built in parts (bench/gpu/compare.sh's split: the base rows, then each tuned family with
--setups, then the whole table) is the table one run gives: every step is keyed by its settings alone, never by
the rows asked for, so the parts share the step cache and the last run reuses every step."""
import json

from click.testing import CliRunner

from headstore.cli import main

from .finetune_world import tiny_beir, tiny_bert
from .test_compare_device import SETUPS, write_config


def rows(out) -> list[dict]:
    """compare.json's rows without what depends on the process (seconds, peak memory)."""
    return [{k: v for k, v in r.items() if k not in ("seconds", "peak_mb")}
            for r in json.loads((out / "compare.json").read_text())["rows"]]


def compare(cfg, out, *args) -> str:
    r = CliRunner().invoke(main, ["compare", "--config", str(cfg), "--out", str(out), "--device", "cpu", *args])
    assert r.exit_code == 0, r.output
    return r.output


def test_a_table_built_in_parts_is_the_table_of_one_run(tmp_path):
    model, ind = tiny_bert(tmp_path / "model", layers=2), tiny_beir(tmp_path / "in-domain", seed=0)
    cfg = write_config(tmp_path, model, ind, sections_device="cpu")
    whole = tmp_path / "whole"
    compare(cfg, whole)
    parts = tmp_path / "parts"
    base = compare(cfg, parts, "--setups", "frozen-cosine,frozen-head")
    assert "adapt-s0: running" not in base and "lora-s0: running" not in base
    for family in ("adapted", "lora"):  # each family's own steps; the base ones reused
        ran = compare(cfg, parts, "--setups", f"{family}-cosine,{family}-head")
        assert "featurize-base: reusing" in ran and "head-base-s0: reusing" in ran
    last = compare(cfg, parts)
    assert ": running" not in last  # every step of the whole table was made by a part
    assert [r["setup"] for r in rows(parts)] == SETUPS
    assert rows(parts) == rows(whole)
