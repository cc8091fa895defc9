"""The lines under cli compare's tables: the time split adds up every step by part, the MLM note says why each
run stopped and whether it settled under the settle rule, the tuning note gives the chosen lr and each seed's
kept epoch."""
from types import SimpleNamespace

from headstore.heads.experiments.compare.notes import adaptation_note, time_note, time_split, tuning_note


def _curve(values):
    return [{"step": 10 * (i + 1), "loss": v} for i, v in enumerate(values)]


def test_time_split_sums_every_step_by_part():
    steps = SimpleNamespace(seconds={
        "featurize-base": 100.0, "featurize-lora-s0": 50.0, "mlm-probe": 30.0, "adapt-s0": 70.0,
        "lora-s0": 200.0, "lora-s0-lr0.5": 180.0, "adapters-s1": 90.0, "finetuned-s2": 60.0,
        "head-base-s0": 10.0, "eval-base-s0-scifact": 5.0, "mlm-lora-s0": 7.0, "mlm-base": 3.0})
    split = time_split(steps)
    assert split == {"stores": 150.0, "MLM adaptation": 100.0, "tuning": 530.0, "heads": 10.0,
                     "evaluation": 5.0, "forgetting probe": 10.0}
    assert sum(split.values()) == sum(steps.seconds.values())  # nothing dropped
    note = time_note(split)
    assert note.startswith("Time, all steps of the run from scratch: 13.4 min")
    assert note.index("tuning") < note.index("stores") < note.index("MLM adaptation")  # largest first


def test_adaptation_note_says_why_it_stopped_and_never_calls_a_diverging_run_settled():
    falling_then_flat = _curve([5.0] * 2 + [4.0] * 2 + [3.0] * 4 + [3.0] * 4)
    diverging = _curve([3.0] * 4 + [3.5] * 4 + [4.5] * 4)
    steps = SimpleNamespace(results={
        "mlm-probe": {"steps": 120, "stopped": "settled", "last_loss_mean10": 3.0, "losses": falling_then_flat},
        "adapt-s0": {"steps": 120, "stopped": "cap", "last_loss_mean10": 4.5, "losses": diverging},
        "head-base-s0": {"primary": "x"}})
    note = adaptation_note(steps)
    probe, adapt = note.split("; ")
    assert "mlm-probe: 120 steps (stopped at a settled check)" in probe and "settled" in probe
    assert "NOT settled" not in probe
    assert "adapt-s0: 120 steps (stopped at the cap)" in adapt and "NOT settled" in adapt
    assert "+28.6%" in adapt  # the loss rose from the middle to the last quarter: said as a rise
    assert "head-base" not in note


def test_tuning_note_names_the_chosen_lr_and_each_seeds_kept_epoch():
    lora = {0: SimpleNamespace(tuning={"encoder_lr": 5e-4, "candidates": [[2.5e-4, 0.71], [5e-4, 0.73], [1e-3, 0.70]],
                                       "best_epoch": 3, "epochs_run": 5, "stopped_because": "patience"}),
            1: SimpleNamespace(tuning={"encoder_lr": 5e-4, "best_epoch": 2, "epochs_run": 4,
                                       "stopped_because": "patience"})}
    base = {0: SimpleNamespace(tuning=None)}
    note = tuning_note({"base": base, "lora": lora})
    assert "lora: encoder lr 0.0005 chosen on dev at seed 0" in note
    assert "0.00025: 0.7100, 0.0005: 0.7300, 0.001: 0.7000" in note
    assert "s0: best epoch 3 of 5 (patience); s1: best epoch 2 of 4 (patience)" in note
    assert "base" not in note.split("others): ")[1]
    assert tuning_note({"base": base}) == ""
