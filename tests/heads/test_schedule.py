"""heads.schedule.lr_lambda: the factors are bit-identical to those of the schedules headstore always used.

The digests were recorded from the implementation on transformers' private `_get_*_lr_lambda` helpers
(transformers 5.23) before it moved to the public schedule functions: every (schedule, warm-up, total,
step) of the grid below, each factor's exact bits (float.hex)."""
import hashlib

import pytest

from headstore.featurize.tuning.schedule import lr_lambda

WARMUPS = (0, 1, 2, 3, 7, 10, 60)  # none, short, longer than the run
TOTALS = (1, 2, 3, 10, 50, 57)
RECORDED = {
    "cosine": "8b511f4a96d1acde4407333033444c92e96801511751dcb9bea4efcf2d33441f",
    "linear": "bf95b8135551f82478dc0a39319723abc0a0c1781f4c247f498e5071f07a07c7",
    "constant": "b21d0e3621fbdb88277f812004fcdb705532a5fd4ce733af7405f825e5539858",
}


def factors(schedule: str) -> list[float]:
    out = []
    for warmup in WARMUPS:
        for total in TOTALS:
            f = lr_lambda(schedule, warmup, total)
            out += [f(step) for step in range(total + 3)]  # steps past the end too
    return out


@pytest.mark.parametrize("schedule", sorted(RECORDED))
def test_factors_are_bit_identical_to_the_recorded_ones(schedule):
    values = factors(schedule)
    assert all(type(v) is float for v in values)
    assert hashlib.sha256(",".join(v.hex() for v in values).encode()).hexdigest() == RECORDED[schedule]


def test_a_few_cosine_factors_by_value():
    f = lr_lambda("cosine", 7, 50)
    assert [f(s).hex() for s in (0, 6, 7, 20, 49, 50)] == [
        "0x1.2492492492492p-3", "0x1.0000000000000p+0", "0x1.0000000000000p+0", "0x1.94f4b4b5351a6p-1",
        "0x1.5da9b4d710e00p-10", "0x0.0p+0"]


@pytest.mark.parametrize("schedule", sorted(RECORDED))
def test_same_as_the_private_helpers_while_transformers_has_them(schedule):
    import transformers.optimization as hf

    names = {"cosine": "_get_cosine_schedule_with_warmup_lr_lambda",
             "linear": "_get_linear_schedule_with_warmup_lr_lambda"}
    warm = getattr(hf, "_get_constant_schedule_with_warmup_lr_lambda", None)
    decay = getattr(hf, names[schedule], None) if schedule in names else warm
    if warm is None or decay is None:
        pytest.skip("this transformers no longer has the private lambdas (the digests above still hold)")
    extra = {"cosine": {"num_cycles": 0.5}, "linear": {}, "constant": {}}[schedule]
    for warmup in WARMUPS:
        for total in TOTALS:
            kwargs = {"num_warmup_steps": warmup, **extra}
            if schedule != "constant":
                kwargs["num_training_steps"] = total
            f = lr_lambda(schedule, warmup, total)
            for step in range(total + 3):
                want = warm(step + 1, num_warmup_steps=warmup) if step < warmup else decay(step, **kwargs)
                assert f(step) == float(want), (warmup, total, step)


def test_unknown_schedule_names_the_valid_ones():
    with pytest.raises(ValueError, match="cosine"):
        lr_lambda("step", 1, 10)


@pytest.mark.parametrize("schedule", sorted(RECORDED))
def test_same_as_transformers_public_schedule_functions(schedule):
    """The formulas written out equal the lambdas of the LambdaLR transformers' public functions return (the
    warm-up shifted by one update, module doc), bit for bit."""
    import torch
    import transformers

    makers = {"cosine": transformers.get_cosine_schedule_with_warmup,
              "linear": transformers.get_linear_schedule_with_warmup,
              "constant": transformers.get_constant_schedule_with_warmup}
    for warmup in WARMUPS:
        for total in TOTALS:
            opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
            kwargs = {} if schedule == "constant" else {"num_training_steps": total}
            decay = makers[schedule](opt, num_warmup_steps=warmup, **kwargs).lr_lambdas[0]
            warm = transformers.get_constant_schedule_with_warmup(opt, num_warmup_steps=warmup).lr_lambdas[0]
            f = lr_lambda(schedule, warmup, total)
            for step in range(total + 3):
                assert f(step) == float(warm(step + 1) if step < warmup else decay(step)), (warmup, total, step)


def test_the_schedule_imports_no_transformers():
    import subprocess
    import sys

    code = ("import sys; from headstore.featurize.tuning.schedule import lr_lambda; lr_lambda('cosine', 3, 10)(5); "
            "print('transformers' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
