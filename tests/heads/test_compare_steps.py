"""Issue 37's defects in `cli compare`'s steps, on the tiny world of test_compare: the forgetting step scores the
encoder and probe head of this run's settings (never links left by an earlier run), the MLM step's key holds
the text split, and the trainable-parameter column counts the parameters that trained."""
import json
from pathlib import Path

import polars as pl
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from headstore.cli import main
from headstore.featurize.tuning.mlm_head import HEAD_FILE

from .test_compare import world  # noqa: F401  the same tiny world, run here in folders of its own

SETUPS = "frozen-cosine,frozen-head,adapted-cosine,adapted-head,finetuned-cosine,finetuned-head"


class Run:
    """One `cli compare` run: compare.json's rows by setup, the steps that ran (not reused), each step's folder."""

    def __init__(self, cfg: Path, out: Path, *args: str):
        r = CliRunner().invoke(main, ["compare", "--config", str(cfg), "--out", str(out), "--seeds", "0", *args])
        assert r.exit_code == 0, r.output
        self.out, self.ran, self.folders = out, set(), {}
        for line in r.output.splitlines():  # "[compare] NAME: running -> DIR" | "[compare] NAME: reusing DIR (...)"
            if line.startswith("[compare] ") and (": running -> " in line or ": reusing " in line):
                name, rest = line.removeprefix("[compare] ").split(": ", 1)
                self.folders[name] = Path(rest.removeprefix("running -> ").removeprefix("reusing ").split(" (")[0])
                if rest.startswith("running"):
                    self.ran.add(name)
        self.by = {row["setup"]: row for row in json.loads((out / "compare.json").read_text())["rows"]}

    def scored(self, name: str) -> Path:
        """The model folder an MLM step scored: links to the encoder's files and the probe's head."""
        return self.folders[name] / "model"

    def made(self, path: Path) -> str:
        """The name of the step whose folder `path` resolves into."""
        folder = self.out.resolve() / path.resolve().relative_to(self.out.resolve()).parts[0]
        return next(name for name, f in self.folders.items() if f.resolve() == folder)


def variant(cfg: Path, name: str, *edits: tuple[str, str]) -> Path:
    text = cfg.read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = cfg.with_name(name)
    path.write_text(text)
    return path


def changed_parameters(before: Path, after: Path) -> int:
    """Elements of the tensors whose values differ between two model folders: the parameters that trained."""
    a, b = load_file(str(before / "model.safetensors")), load_file(str(after / "model.safetensors"))
    assert a.keys() == b.keys()
    return sum(a[k].numel() for k in a if not torch.equal(a[k], b[k]))


def mlm(row: dict, texts: str) -> float:
    return row["mlm_loss"][texts]["mean"]


@pytest.fixture(scope="module")
def first(world):  # noqa: F811
    root, cfg = world
    return root, cfg, Run(cfg, root / "out-steps", "--setups", SETUPS)


def test_trainable_parameters_count_what_trained(first):
    """Against the tensors that changed: a tuned encoder's cosine row counts its encoder's trained parameters
    (not the head's; not the pooler, which never trains), its head row adds the head's."""
    root, _, run = first
    model, by = root / "model", run.by
    head = by["frozen-head"]["trainable_parameters"]
    assert head > 0 == by["frozen-cosine"]["trainable_parameters"]
    base = load_file(str(model / "model.safetensors"))
    all_but_pooler = sum(v.numel() for k, v in base.items() if not k.startswith("pooler."))
    adapted = run.folders["adapt-s0"] / "model"
    finetuned = run.scored("mlm-finetuned-s0")  # links to the fine-tuned encoder's files
    for setup, encoder in (("adapted", adapted), ("finetuned", finetuned)):
        trained = changed_parameters(model, encoder)
        assert trained == all_but_pooler, setup  # unfreeze = all: every block trained
        assert by[f"{setup}-cosine"]["trainable_parameters"] == trained, setup
        assert by[f"{setup}-head"]["trainable_parameters"] == trained + head, setup


def test_top_k_counts_the_top_block_only(first):
    """unfreeze = top-k: the fine-tuned rows count the top k layers (here 1 of 2), not every block."""
    root, cfg, before = first
    top1 = variant(cfg, "compare-top1.toml", ("[finetune]\n", '[finetune]\nunfreeze = "top-k"\ntop_k = 1\n'))
    run = Run(top1, before.out, "--setups", SETUPS)
    base = load_file(str(root / "model" / "model.safetensors"))
    top_layer = sum(v.numel() for k, v in base.items() if k.startswith("encoder.layer.1."))
    head = run.by["frozen-head"]["trainable_parameters"]
    assert run.by["finetuned-cosine"]["trainable_parameters"] == top_layer
    assert run.by["finetuned-head"]["trainable_parameters"] == top_layer + head
    assert changed_parameters(root / "model", run.scored("mlm-finetuned-s0")) == top_layer


def test_a_changed_finetune_setting_rescores_the_new_encoder(first):
    """Fewer fine-tuning steps make another encoder: its MLM loss is computed on its own weights (the links
    point into the step that made them in this run), not on the first run's."""
    _, cfg, before = first
    run = Run(cfg, before.out, "--setups", SETUPS, "--finetune-steps", "1")
    assert "mlm-finetuned-s0" in run.ran and "mlm-base" not in run.ran
    assert mlm(run.by["finetuned-cosine"], "general") != mlm(before.by["finetuned-cosine"], "general")
    assert mlm(run.by["frozen-cosine"], "general") == mlm(before.by["frozen-cosine"], "general")
    model = run.scored("mlm-finetuned-s0")
    assert {p.name for p in model.iterdir()} >= {"model.safetensors", "config.json", HEAD_FILE}
    encoder_step = run.made(model / "model.safetensors")
    assert encoder_step.startswith("finetuned-s0") and encoder_step in run.ran  # made in this run
    assert run.folders[encoder_step] != before.folders[encoder_step]
    assert run.made(model / HEAD_FILE) == "mlm-probe"


def test_a_changed_probe_rescores_every_encoder_under_the_new_head(first):
    """probe_steps changes the probe head: every encoder scored with the probe is scored with the new one."""
    _, cfg, first_run = first
    before = Run(cfg, first_run.out, "--setups", SETUPS)
    fewer = variant(cfg, "compare-probe-2.toml", ("[mlm]\n", "[mlm]\nprobe_steps = 2\n"))
    run = Run(fewer, before.out, "--setups", SETUPS)
    assert {"mlm-probe", "mlm-base", "mlm-finetuned-s0"} <= run.ran
    assert not any(n.startswith("finetuned-s") for n in run.ran)  # the fine-tuned encoder does not use the probe
    for setup in ("frozen-cosine", "finetuned-cosine"):
        assert mlm(run.by[setup], "general") != mlm(before.by[setup], "general"), setup
    model = run.scored("mlm-finetuned-s0")
    assert run.made(model / HEAD_FILE) == "mlm-probe" and run.folders["mlm-probe"] != before.folders["mlm-probe"]
    assert run.made(model / "model.safetensors") == before.made(before.scored("mlm-finetuned-s0") / "model.safetensors")


def test_switching_the_general_text_split_recomputes_the_mlm_losses(world, tmp_path):  # noqa: F811
    """mlm_text_split is part of the MLM step's key: validation -> test scores the test texts."""
    root, cfg = world
    general = tmp_path / "general.parquet"
    lines = (root / "general.txt").read_text().splitlines()
    pl.DataFrame({"text": lines, "split": ["validation"] * 10 + ["test"] * (len(lines) - 10)}).write_parquet(general)

    def split(name: str) -> Path:
        return variant(cfg, f"compare-{name}.toml", (f'mlm_text = "{root / "general.txt"}"', f'mlm_text = "{general}"'),
                       ('mlm_text_split = ""', f'mlm_text_split = "{name}"'))
    validation = Run(split("validation"), tmp_path / "out", "--setups", "frozen-cosine")
    test = Run(split("test"), tmp_path / "out", "--setups", "frozen-cosine")
    assert test.ran == {"mlm-base"}
    assert mlm(test.by["frozen-cosine"], "general") != mlm(validation.by["frozen-cosine"], "general")
    assert mlm(test.by["frozen-cosine"], "in_domain") == mlm(validation.by["frozen-cosine"], "in_domain")
