"""`adapt` until settled (issue 37): a constant lr after warm-up, a check every `settle_check` steps, a stop at
the first check the rule says settled or at the cap; resumable, and a capped run extended continues exactly."""
from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file

from headstore.featurize.encoder.config import AdaptConfig
from headstore.featurize.tuning.adapt import CHECKPOINT, _Run, adapt
from headstore.featurize.tuning.settle import settled

from test_adapt import VOCAB, save_tiny_model, small_config

CHECK, CAP = 40, 400


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny BERT and random word sequences: nothing to learn beyond the word frequencies, so the MLM loss
    falls for a few dozen steps and then stays flat."""
    root = tmp_path_factory.mktemp("settle")
    rng = random.Random(0)
    words = VOCAB[5:-4]
    corpus = root / "random-words.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(200)) + "\n")
    return root, save_tiny_model(root / "tiny"), corpus


def until_settled(model, **overrides) -> AdaptConfig:
    return small_config(model, **{"max_steps": CAP, "save_every": 1000, "lr": 3e-3, "until_settled": True,
                                  "settle_check": CHECK, **overrides})


def weights(folder):
    return load_file(str(folder / "model.safetensors"))


def assert_same_weights(a, b):
    a, b = weights(a), weights(b)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def whole(world):
    root, model, corpus = world
    return adapt(until_settled(model), [corpus], root / "whole"), root / "whole"


def test_it_stops_at_the_first_check_that_says_settled(whole):
    summary, out = whole
    steps = summary["steps"]
    assert summary["finished"] and summary["stopped"] == "settled" and not summary["capped"] and summary["settled"]
    assert steps % CHECK == 0 and CHECK < steps < CAP and summary["total_steps"] == CAP
    losses = summary["losses"]  # ten-step means: the rule judged losses[:check // 10] at each check
    assert len(losses) == steps // 10
    assert settled(losses)[0]
    assert not any(settled(losses[:check // 10])[0] for check in range(CHECK, steps, CHECK))
    assert json.loads((out / "adapt.json").read_text())["stopped"] == "settled"


def test_the_lr_is_constant_after_warm_up_and_ignores_the_cap():
    cfg = AdaptConfig(lr=1e-3, until_settled=True, settle_check=100, warmup_ratio=0.06, max_steps=1000)
    for total in (200, 1000):
        run = _Run(cfg, None, "", None, None, [], None, total=total, warmup=6)
        assert [run.lr(s) for s in range(8)] == pytest.approx([1e-3 * (s + 1) / 6 for s in range(6)] + [1e-3] * 2)
        assert run.lr(total - 1) == pytest.approx(1e-3)
    decaying = _Run(AdaptConfig(lr=1e-3), None, "", None, None, [], None, total=200, warmup=6)
    assert decaying.lr(199) < 1e-5  # the budgeted run still decays to ~0


def test_a_capped_run_extended_continues_as_one_run(world, whole):
    """The cap is the only thing a rerun may change: a run capped before it settled, resumed with the full
    cap, stops where the uncapped run stopped, with its weights."""
    root, model, corpus = world
    summary, full = whole
    out = root / "capped"
    capped = adapt(until_settled(model, max_steps=CHECK), [corpus], out)
    assert capped["finished"] and capped["stopped"] == "cap" and capped["capped"] and capped["steps"] == CHECK
    extended = adapt(until_settled(model), [corpus], out)
    assert extended["resumed_from_step"] == CHECK and extended["steps"] == summary["steps"]
    assert extended["stopped"] == "settled"
    assert_same_weights(full, out)


def test_an_interrupted_run_resumes_to_the_same_stop(world, whole):
    root, model, corpus = world
    summary, full = whole
    out = root / "interrupted"
    part = adapt(until_settled(model), [corpus], out, stop_after_steps=CHECK + 5)
    assert not part["finished"] and part["stopped"] is None and part["steps"] == CHECK + 5
    rest = adapt(until_settled(model), [corpus], out)
    assert rest["steps"] == summary["steps"] and rest["stopped"] == "settled"
    assert_same_weights(full, out)
    again = adapt(until_settled(model), [corpus], out)  # finished: the last check is judged again, no step taken
    assert again["steps"] == summary["steps"] and again["resumed_from_step"] == summary["steps"]


def test_a_checkpoint_of_an_older_headstore_or_another_default_is_refused(world, monkeypatch):
    """Issue 54, item 5: a checkpoint's key holds every setting's resolved value and the adapt recipe version. One
    written by an older headstore (no recipe version: what its missing settings were cannot be told) is refused
    in one line, never resumed under today's defaults; so is one whose default changed in the code since."""
    from headstore.data import keys

    root, model, corpus = world
    out = root / "old"
    adapt(small_config(model, max_steps=6, save_every=2), [corpus], out, stop_after_steps=2)
    state_file = out / CHECKPOINT / "state.json"
    whole = state_file.read_text()
    assert json.loads(whole)["resume_key"]["recipe"] == "adapt/1"
    monkeypatch.setitem(keys.RECIPES, "adapt", 2)  # the code's numbers changed
    with pytest.raises(ValueError, match=r"different config \(recipe: 'adapt/1' -> 'adapt/2'\)"):
        adapt(small_config(model, max_steps=6, save_every=2), [corpus], out)
    monkeypatch.undo()
    state = json.loads(whole)
    for name in ("recipe", "until_settled", "settle_check"):
        del state["resume_key"][name]
    state_file.write_text(json.dumps(state))
    with pytest.raises(ValueError, match=r"checkpoint-last was written by an older headstore .*delete it"):
        adapt(small_config(model, max_steps=6, save_every=2), [corpus], out)
    state_file.write_text(whole)
    assert adapt(small_config(model, max_steps=6, save_every=2), [corpus], out)["resumed_from_step"] == 2


def test_settle_check_below_four_windows_is_refused():
    with pytest.raises(ValueError, match="settle_check"):
        AdaptConfig(settle_check=30)
