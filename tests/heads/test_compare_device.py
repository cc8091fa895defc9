"""`cli compare --device`: one device for every part of the table (stores, heads, the MLM probe and adaptation,
tuning, evaluation, the MLM loss), over the [featurize] / [adapt] / [finetune] sections' own `device`; "auto"
leaves each part its own and every step key as it was. On a tiny random BERT with tiny BEIR data."""
import json

import pytest
import torch
from click.testing import CliRunner

from headstore.cli import main
from headstore.heads.experiments.compare.config import CompareConfig, device_key, load_compare_config, on_device
from headstore.data.keys import resolved

from .finetune_world import sentence, tiny_beir, tiny_bert

SETUPS = ["frozen-cosine", "frozen-head", "adapted-head", "lora-head"]


def write_config(root, model, ind, sections_device: str, compare_device: str | None = None):
    """A tiny table whose [featurize], [adapt] and [finetune] ask for `sections_device`."""
    import random

    rng = random.Random(3)
    (root / "general.txt").write_text("\n".join(sentence(rng, 20) for _ in range(20)) + "\n")
    cfg = root / f"compare-{sections_device}-{compare_device}.toml"
    cfg.write_text(f'''
[data]
in_domain = "{ind}"
mlm_text = "{root / 'general.txt'}"
mlm_text_split = ""

[featurize]
model = "{model}"
dtype = "float32"
batch_tokens = 2048
device = "{sections_device}"

[head]
hidden = 16
out_dim = 8
residual = false
normalize = "none"
impostors = "all"
mined_k = 0
epochs = 2
batch_size = 8

[adapt]
max_steps = 3
batch_size = 4
max_length = 16
device = "{sections_device}"

[finetune]
max_steps = 2
encoder_lr = 1e-3
keep = "last"
lr_grid = [1.0]
device = "{sections_device}"

[mlm]
max_texts = 8
holdout_fraction = 0.2

[compare]
seeds = [0]
setups = {json.dumps(SETUPS)}
n_boot = 200
{f'device = "{compare_device}"' if compare_device else ""}
''')
    return cfg


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmpdev")
    return root, tiny_bert(root / "model", layers=2), tiny_beir(root / "in-domain", seed=0)


def records(out, pattern: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob(pattern))]


def assert_every_part_on(out, device: str):
    """Every record a part writes says `device`; every step's key holds it."""
    config = json.loads((out / "config.json").read_text())
    assert config["device"] == device
    assert [config[s]["device"] for s in ("featurize", "adapt", "finetune")] == [device] * 3
    adapts = records(out, "*/model/adapt.json")  # the MLM probe and the adaptation
    assert len(adapts) == 2 and {a["device"] for a in adapts} == {device}
    tuned = records(out, "lora-s0*/finetune.json")
    assert len(tuned) == 1 and tuned[0]["config"]["device"] == device
    heads = records(out, "head-*/head/config.json")
    evals = records(out, "eval-*/eval/metrics.json")
    assert len(heads) == 2 and len(evals) == 3  # frozen and adapted heads; frozen, adapted, LoRA scored
    assert {m["device"].split(":")[0] for m in heads + evals} == {device}
    steps = records(out, "*/step.json")
    keys = {s["name"]: s["settings"] for s in steps}
    assert {"mlm-base", "mlm-adapted-s0", "mlm-lora-s0", "head-base-s0", "eval-lora-s0-in-domain"} <= set(keys)
    for name, settings in keys.items():  # the device in every key: its section's settings, else its own entry
        section = next((s for s in ("featurize", "adapt", "finetune") if s in settings), None)
        assert (settings[section] if section else settings)["device"] == device, name


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cpu_overrides_every_parts_own_device(world):
    root, model, ind = world
    cfg = write_config(root, model, ind, sections_device="cuda")
    bare = CliRunner().invoke(main, ["compare", "--config", str(cfg), "--out", str(root / "bare")])
    assert bare.exit_code == 2 and "cuda" in bare.output  # the sections alone ask for a card there is none of
    out = root / "cpu"
    r = CliRunner().invoke(main, ["compare", "--config", str(cfg), "--out", str(out), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert_every_part_on(out, "cpu")
    rows = json.loads((out / "compare.json").read_text())["rows"]
    assert [row["setup"] for row in rows] == SETUPS
    # [compare] device in the TOML is the option's twin: the same keys, every step reused
    twin = write_config(root, model, ind, sections_device="cuda", compare_device="cpu")
    again = CliRunner().invoke(main, ["compare", "--config", str(twin), "--out", str(out)])
    assert again.exit_code == 0 and "running" not in again.output, again.output
    assert json.loads((out / "compare.json").read_text())["rows"] == rows


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_a_card_fails_before_any_step(world):
    root, model, ind = world
    cfg = write_config(root, model, ind, sections_device="cpu")
    out = root / "no-card"
    r = CliRunner().invoke(main, ["compare", "--config", str(cfg), "--out", str(out), "--device", "cuda"])
    assert r.exit_code == 2 and "torch.cuda.is_available() is False" in r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert not out.exists() or not list(out.glob("*/step.json"))


def test_auto_keeps_each_part_and_is_in_every_key(world):
    root, model, ind = world
    cfg = load_compare_config(str(write_config(root, model, ind, sections_device="cpu")))
    here = "cuda" if torch.cuda.is_available() else "cpu"  # "auto" is keyed by what it resolves to on this machine
    assert cfg.device == "auto" and on_device(cfg) is cfg and device_key(cfg) == {"device": here}
    given = load_compare_config(str(write_config(root, model, ind, sections_device="auto")), device="cuda")
    moved = on_device(given)
    for section in ("featurize", "adapt", "finetune"):  # the device in each section's step key
        assert resolved(getattr(moved, section))["device"] == "cuda"
        assert getattr(given, section).device == "auto" and resolved(getattr(given, section))["device"] == here
    assert moved.head == given.head and moved.train == given.train  # no field added to what heads are keyed by
    assert device_key(moved) == {"device": "cuda"}


def test_an_unknown_device_lists_the_valid_ones(world):
    with pytest.raises(ValueError, match=r"device 'tpu' not valid; choose one of \['auto', 'cpu', 'cuda'\]"):
        CompareConfig(in_domain="x", device="tpu")
    root, model, ind = world
    r = CliRunner().invoke(main, ["compare", "--config", str(write_config(root, model, ind, "cpu")),
                                  "--out", str(root / "bad"), "--device", "tpu"])
    assert r.exit_code == 2 and "'auto', 'cpu', 'cuda'" in r.output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_cuda_puts_every_part_on_the_card(world):
    root, model, ind = world
    out = root / "cuda"
    cfg = write_config(root, model, ind, sections_device="cpu")
    r = CliRunner().invoke(main, ["compare", "--config", str(cfg), "--out", str(out), "--device", "cuda"])
    assert r.exit_code == 0, r.output
    assert_every_part_on(out, "cuda")
