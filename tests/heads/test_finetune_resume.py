"""cli finetune across processes (issue 37 section 4): a run killed after an epoch and called again with the same out
dir goes on from its checkpoint and writes the encoder, head and finetune.json of an uninterrupted run, bit for bit;
a checkpoint of another run is refused; a half-written one is never read; `cli compare` rerun after a kill reaches
the resume."""
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from headstore.cli import main
from headstore.heads.apply.finetune import FinetuneConfig, finetune
from headstore.heads.apply.finetune_resume import CHECKPOINT, Checkpoint
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.training.run import train_head

from .compare_world import TINY_HEAD, patch_default, tiny_featurize, write_compare_toml
from .finetune_world import tiny_beir, tiny_bert
from .test_finetune_epochs import world  # noqa: F401  the same tiny world, built here for this module

TIMING = ("seconds", "timing", "resumed_at_epochs", "earlier_seconds")  # what a resumed run may say otherwise
STOPS = dict(setup="full", encoder_lr=3e-2, max_epochs=6, patience=1)  # rises, then dev falls: stops by patience
GRADUAL = dict(setup="lora", unfreeze="gradual", unfreeze_interval=10, encoder_lr=1e-2, max_epochs=4, patience=4,
               keep="last")  # every epoch runs


class Killed(BaseException):
    """The process ending where it stands (no `except Exception` catches it)."""


def kill_after(monkeypatch, epochs: set[int]):
    """The next runs die right after the checkpoint of any epoch in `epochs` is written."""
    real = Checkpoint.save

    def save(self, state):
        real(self, state)
        if state["epoch"] in epochs:
            raise Killed(state["epoch"])

    monkeypatch.setattr(Checkpoint, "save", save)


def _run(world, out: Path, head: str = "head", **kw) -> dict:
    root, model, _ = world
    cfg = FinetuneConfig(device="cpu", batch_size=8, warmup_ratio=0.0, **kw)
    return finetune(str(root / head), str(out), cfg, encoder=str(model), progress=False)


def written(out: Path, root: Path) -> tuple[dict, dict, dict]:
    """(encoder tensors, head tensors, finetune.json less its timing) of a finished run; `root`'s path as OUT."""
    summary = json.loads((out / "finetune.json").read_text().replace(str(root), "OUT"))
    return (load_file(str(out / "encoder" / "model.safetensors")), load_file(str(out / "head" / "head.safetensors")),
            {k: v for k, v in summary.items() if k not in TIMING})


def assert_same(a: Path, b: Path, root_a: Path | None = None, root_b: Path | None = None) -> None:
    """Two finished runs wrote the same bits (paths under `root_a` / `root_b`, default the out dirs, aside)."""
    root_a, root_b = root_a or a, root_b or b
    (enc_a, head_a, json_a), (enc_b, head_b, json_b) = written(a, root_a), written(b, root_b)
    assert enc_a.keys() == enc_b.keys() and all(torch.equal(enc_a[k], enc_b[k]) for k in enc_a)
    assert head_a.keys() == head_b.keys() and all(torch.equal(head_a[k], head_b[k]) for k in head_a)
    assert json_a == json_b  # dev curve, best epoch, losses of every step, why it stopped
    head_config = [json.loads((o / "head" / "config.json").read_text().replace(str(r), "OUT"))
                   for o, r in ((a, root_a), (b, root_b))]
    for c in head_config:  # the source head's own train_seconds: two compare runs trained a head each
        c["finetune"] = {k: v for k, v in c["finetune"].items() if k not in TIMING}
        c.pop("train_seconds", None)
    assert head_config[0] == head_config[1]


@pytest.mark.parametrize("settings,kills", [(STOPS, [{1}]), (GRADUAL, [{1}, {2}])], ids=["full-patience", "lora-gradual"])
def test_a_killed_run_resumed_writes_what_an_uninterrupted_run_writes(world, monkeypatch, capfd, settings, kills):
    """Killed after epoch 1 (lora: and again after epoch 2), called again: the same bits as a run never killed.
    Dropout (the tiny BERT's 0.1), the batch order, AdamW's moments, gradual unfreezing, the best epoch's kept
    state and the negatives cache all carry over."""
    root = world[0]
    name = settings["setup"]
    reference = _run(world, root / f"resume-{name}-ref", **settings)
    out = root / f"resume-{name}"
    for epochs in kills:
        with monkeypatch.context() as m:
            kill_after(m, epochs)
            with pytest.raises(Killed):
                _run(world, out, **settings)
        assert (out / CHECKPOINT).is_file() and not (out / "finetune.json").exists()
    capfd.readouterr()
    summary = _run(world, out, **settings)
    said = capfd.readouterr().err
    last = max(max(e) for e in kills)
    assert f"resuming from epoch {last} (step {last * summary['steps_per_epoch']} of" in said, said
    assert summary["resumed_at_epochs"] == [max(e) for e in kills]
    assert 0 < summary["earlier_seconds"] <= summary["seconds"]
    assert not (out / CHECKPOINT).exists() and not list(out.glob("*.incomplete"))  # the finished run's gone
    assert reference["epochs_run"] > last  # the resumed run trained epochs of its own
    if name == "full":
        assert reference["stopped_because"] == "patience" and reference["best_epoch"] >= 1
    else:
        # the second block unfrozen in epoch 2, between the kills: the first resume trains one block, the second two
        assert [int(s) for s in reference["unfrozen_at_step"]] == [0, 10] and summary["steps_per_epoch"] == 7
    assert_same(out, root / f"resume-{name}-ref")


def killed_at_epoch_1(world, monkeypatch, out: Path) -> None:
    """A run of STOPS into `out` killed right after its first epoch's checkpoint."""
    with monkeypatch.context() as m:
        kill_after(m, {1})
        with pytest.raises(Killed):
            _run(world, out, **STOPS)


def test_a_checkpoint_of_another_run_is_refused(world, monkeypatch):
    """Another encoder lr, or another head, with the out dir of a killed run: a one-line error naming the
    checkpoint and what differs; the checkpoint is left as it was."""
    root, model, beir = world
    out = root / "refuse"
    killed_at_epoch_1(world, monkeypatch, out)
    before = (out / CHECKPOINT).read_bytes()
    with pytest.raises(ValueError, match=r"refuse/checkpoint\.pt: the checkpoint of another finetune run \(its "
                                         r"settings differ\)"):
        _run(world, out, **{**STOPS, "encoder_lr": 1e-2})
    train_head(str(root / "store"), str(beir), str(root / "head-seed1"), HeadConfig(hidden=16, out_dim=8, residual=False),
               TrainConfig(epochs=1, batch_size=8, mined_k=2, schedule="constant", seed=1), progress=False)
    with pytest.raises(ValueError, match=r"its head differ"):
        _run(world, out, head="head-seed1", **STOPS)
    r = CliRunner().invoke(main, ["finetune", "--head", str(root / "head"), "--out", str(out), "--model", str(model),
                                  "--device", "cpu", "--encoder-lr", "0.01", "--max-epochs", "6", "--patience", "1"])
    assert r.exit_code != 0 and "Traceback" not in r.output
    (line,) = [x for x in r.output.splitlines() if CHECKPOINT in x]
    assert str(out / CHECKPOINT) in line and "settings" in line and "batch_size" not in line
    assert (out / CHECKPOINT).read_bytes() == before


def test_a_default_changed_in_the_code_makes_another_run(world, monkeypatch):
    """Issue 54, item 5: the checkpoint's key holds every setting's resolved value and the recipe version, so a
    default changed between the kill and the rerun (FinetuneConfig.weight_decay here) is another run, refused in
    one line, never continued under the new default."""
    out = world[0] / "default-moved"
    killed_at_epoch_1(world, monkeypatch, out)
    patch_default(monkeypatch, FinetuneConfig, "weight_decay", 0.05)
    with pytest.raises(ValueError, match=r"default-moved/checkpoint\.pt: the checkpoint of another finetune run \(its "
                                         r"settings differ\)"):
        _run(world, out, **STOPS)


def test_a_half_written_checkpoint_is_never_read(world, monkeypatch):
    """A kill while epoch 2's checkpoint was being written leaves epoch 1's whole and a torn `.incomplete`: the
    run resumes from epoch 1 and writes an uninterrupted run's bits; a torn file alone: it starts afresh."""
    root = world[0]
    reference = root / "torn-ref"
    _run(world, reference, **STOPS)
    out = root / "torn"
    with monkeypatch.context() as m:
        kill_after(m, {1})
        with pytest.raises(Killed):
            _run(world, out, **STOPS)
    whole = (out / CHECKPOINT).read_bytes()
    torn = out / (CHECKPOINT + ".incomplete")
    torn.write_bytes(whole[: len(whole) // 2])
    summary = _run(world, out, **STOPS)
    assert summary["resumed_at_epochs"] == [1] and summary["epochs_run"] >= 2 and not torn.exists()
    assert_same(out, reference)
    fresh = root / "torn-alone"
    fresh.mkdir()
    (fresh / (CHECKPOINT + ".incomplete")).write_bytes(whole[: len(whole) // 2])
    summary = _run(world, fresh, **STOPS)
    assert summary["resumed_at_epochs"] == [] and summary["earlier_seconds"] == 0
    assert_same(fresh, reference)


def test_compare_rerun_after_a_kill_mid_finetune_resumes_the_step(tmp_path, monkeypatch):
    """`cli compare` killed in its finetune step after epoch 1 (the step's folder made, no step.json): the rerun
    runs that step again in the same folder, which resumes from epoch 1 and writes what an uninterrupted compare
    writes; the step's seconds count the killed process's too."""
    model = tiny_bert(tmp_path / "model", layers=2)
    beir = tiny_beir(tmp_path / "in-domain", n_docs=80, n_train=60, n_test=10)
    cfg = tmp_path / "compare.toml"
    write_compare_toml(cfg, {
        "data": {"in_domain": beir},
        "featurize": tiny_featurize(model),
        "head": {**TINY_HEAD, "mined_k": 2, "epochs": 1},
        "finetune": {"device": "cpu", "encoder_lr": 1e-2, "lr_grid": [1.0], "max_epochs": 3, "patience": 3,
                     "dev_docs": 20},
        "compare": {"seeds": [0], "setups": ["frozen-head", "finetuned-head"], "n_boot": 100}})

    def compare(out: Path):
        return CliRunner().invoke(main, ["compare", "--config", str(cfg), "--out", str(out), "--no-mlm"])

    r = compare(tmp_path / "ref")
    assert r.exit_code == 0, r.output
    out = tmp_path / "killed"
    with monkeypatch.context() as m:
        kill_after(m, {1})
        with pytest.raises(Killed):
            compare(out)
    (step,) = out.glob("finetuned-s0-*")
    assert (step / CHECKPOINT).is_file() and not (step / "step.json").exists()
    r = compare(out)
    assert r.exit_code == 0, r.output
    assert f"[compare] finetuned-s0: running -> {step}" in r.output and "resuming from epoch 1" in r.output
    (ref_step,) = (tmp_path / "ref").glob("finetuned-s0-*")
    assert step.name == ref_step.name
    assert_same(step, ref_step, out, tmp_path / "ref")
    record = json.loads((step / "step.json").read_text())
    assert record["result"]["resumed_at_epochs"] == [1]
    assert record["seconds"] >= record["result"]["earlier_seconds"] > 0
    rows = [{row["setup"]: row for row in json.loads((o / "compare.json").read_text())["rows"]}
            for o in (out, tmp_path / "ref")]
    for row in ("frozen-head", "finetuned-head"):  # the table's figures: the same, CIs included
        assert rows[0][row]["datasets"] == rows[1][row]["datasets"]
    assert rows[0]["finetuned-head"]["seconds"] >= record["seconds"]
