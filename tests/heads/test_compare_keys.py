"""Issue 54, items 5 and 10: a `cli compare` step's key holds the resolved value of every setting that made it,
its recipe version and the contents of every dataset it read (data/keys.py), never only "what differs from the
defaults" and never a path. A default changed between two runs into one --out reruns what it feeds; an edited
dataset reruns its steps; a deleted one is a one-line error, never the old figures with exit 0."""
import dataclasses
import json

import polars as pl
import pytest
from click.testing import CliRunner

from headstore.cli import main
from headstore.data import keys
from headstore.data.keys import content_digest, resolved
from headstore.heads.apply.finetune import FinetuneConfig
from headstore.heads.experiments.compare.run import Steps
from headstore.heads.settings.config import TrainConfig

from .compare_world import patch_default
from .test_compare import world  # noqa: F401  the same tiny world, run here in folders of its own


def ran_steps(output: str) -> set[str]:
    return {line.split(":")[0].split()[-1] for line in output.splitlines() if ": running" in line}


def compare(cfg, out, *args):
    return CliRunner().invoke(main, ["compare", "--config", str(cfg), "--out", str(out), "--seeds", "0", "--no-mlm",
                                     *args])


def test_resolved_holds_every_setting_and_sees_a_changed_default(monkeypatch):
    before = resolved(FinetuneConfig())
    as_set = dataclasses.asdict(FinetuneConfig())
    assert before == {**as_set, "device": keys.device_kind(as_set["device"])} and before["patience"] == 2  # defaults
    assert resolved(TrainConfig()) == TrainConfig().to_dict()
    patch_default(monkeypatch, FinetuneConfig, "patience", 3)
    assert resolved(FinetuneConfig())["patience"] == 3 and resolved(FinetuneConfig()) != before


def test_an_auto_device_is_keyed_by_the_device_it_resolves_to(monkeypatch):
    """"auto" resolves to cuda on a box with a card and to cpu without: two keys, so a step made on a card is
    never reused on a CPU; "cuda:1" is keyed as "cuda" (the card's index does not change the numbers)."""
    import torch

    cfg = FinetuneConfig(device="auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    on_cpu = resolved(cfg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    on_card = resolved(cfg)
    assert on_cpu["device"] == "cpu" and on_card["device"] == "cuda" and on_cpu != on_card
    assert resolved(dataclasses.replace(cfg, device="cuda:1"))["device"] == "cuda"


def test_content_digest_reads_contents_not_paths(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("one\n")
    b.write_text("one\n")
    assert content_digest(a) == content_digest(b)  # the same bytes elsewhere: the same digest
    first = content_digest(a)
    a.write_text("two\n")
    assert content_digest(a) != first
    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    (folder / "qrels" / "test.tsv").write_text("q\td\t1\n")
    before = content_digest(folder)
    (folder / "qrels" / "test.tsv").write_text("q\td\t0\n")
    assert content_digest(folder) != before
    a.unlink()
    with pytest.raises(ValueError, match=r"^--out-of-domain .*a\.txt: no such file or folder"):
        content_digest(a, "--out-of-domain")


def test_a_recipe_bump_or_an_older_folder_reruns_the_step(tmp_path, monkeypatch):
    lines = []
    calls = []
    steps = Steps(tmp_path, lines.append)
    steps.run("eval-x", {"a": 1}, lambda d: calls.append(1) or {"v": 1}, "eval")
    steps.run("eval-x", {"a": 1}, lambda d: calls.append(1) or {"v": 1}, "eval")
    assert len(calls) == 1 and "reusing" in lines[-1]
    assert json.loads(next(tmp_path.glob("eval-x-*/step.json")).read_text())["settings"]["recipe"] == "eval/1"
    monkeypatch.setitem(keys.RECIPES, "eval", 2)  # the code's numbers changed
    Steps(tmp_path, lines.append).run("eval-x", {"a": 1}, lambda d: calls.append(1) or {"v": 2}, "eval")
    assert len(calls) == 2 and "running" in lines[-1]
    old = tmp_path / "eval-y-0123456789"  # a folder of an older headstore: its key has no recipe version
    old.mkdir()
    (old / "step.json").write_text(json.dumps({"settings": {"a": 1}, "seconds": 1.0, "result": {"v": 0}}))
    lines.clear()
    Steps(tmp_path, lines.append)
    assert len(lines) == 1 and "1 step folder(s) of an older headstore" in lines[0] and old.name in lines[0]


def test_a_changed_default_reruns_every_step_it_feeds(world, monkeypatch):  # noqa: F811
    """Issue 54's reproduction: FinetuneConfig.patience 2 -> 3 in the code between two runs into one --out."""
    root, cfg = world
    out = root / "out-default"
    r = compare(cfg, out, "--setups", "frozen-head,finetuned-head")
    assert r.exit_code == 0, r.output
    first = ran_steps(r.output)
    assert {"head-base-s0", "finetuned-s0-lr0.0005"} <= first
    patch_default(monkeypatch, FinetuneConfig, "patience", 3)
    r = compare(cfg, out, "--setups", "frozen-head,finetuned-head")
    assert r.exit_code == 0, r.output
    again = ran_steps(r.output)
    assert {s for s in first if s.startswith("finetuned-")} <= again  # every lr candidate tuned again
    assert "head-base-s0" not in again and "featurize-base" not in again  # what patience does not feed: reused
    assert {"featurize-finetuned-s0", "eval-finetuned-s0-in-domain"} <= again
    tuned = next(out.glob("finetuned-s0-lr0.001-*/step.json"), None) or sorted(out.glob("finetuned-s0-*/step.json"))[-1]
    settings = json.loads(tuned.read_text())["settings"]
    assert settings["recipe"] == "finetune/1" and "patience" in settings["finetune"]
    md = (out / "compare.md").read_text()
    assert "Made by recipe versions" in md and "finetune/1" in md and "eval/1" in md


def test_an_edited_dataset_reruns_its_steps_and_a_deleted_one_is_a_one_line_error(world):  # noqa: F811
    """Issue 54, item 10: the out-of-domain STS table replaced by the same texts with score = 5 - score."""
    root, cfg = world
    sts = root / "ood-sts-edit.parquet"
    pl.read_parquet(root / "ood-sts.parquet").write_parquet(sts)
    edited = root / "compare-edit.toml"
    edited.write_text(cfg.read_text().replace(str(root / "ood-sts.parquet"), str(sts)))
    out = root / "out-edit"
    r = compare(edited, out, "--setups", "frozen-head")
    assert r.exit_code == 0, r.output
    name = "ood-sts-edit"
    before = json.loads((out / "compare.json").read_text())["rows"][0]["datasets"][name]["mean"]
    frame = pl.read_parquet(sts)
    frame.with_columns(score=5.0 - pl.col("score")).write_parquet(sts)
    r = compare(edited, out, "--setups", "frozen-head")
    assert r.exit_code == 0, r.output
    assert ran_steps(r.output) == {"featurize-base", f"eval-base-s0-{name}", "head-base-s0"} | {
        f"eval-base-s0-{d}" for d in ("in-domain", "ood-ir")}  # the store holds its texts: all that reads it
    after = json.loads((out / "compare.json").read_text())["rows"][0]["datasets"][name]["mean"]
    assert after == pytest.approx(-before, abs=1e-6)  # a reversed score: the opposite Spearman
    sts.unlink()
    r = compare(edited, out, "--setups", "frozen-head")
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and str(sts) in errors[0] and "no such file or folder" in errors[0], r.output
    assert "reusing" not in r.output
