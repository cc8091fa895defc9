"""The batch plan: least modelled cost (checked against brute force over every cut), budget
respected, and the resume property -- the plan of any suffix starting at a batch is the tail of
the full plan."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from headstore.featurize.encoder.encode import plan_batches


def plan_cost(lengths, batches, overhead, width):
    """Modelled cost, written directly from the docstring's formula (exact rationals x width)."""
    total = 0
    for start, stop in batches:
        s = max(lengths[start:stop])
        per_text = s * (width + s) if width else s
        total += (stop - start) * per_text + overhead * (width if width else 1)
    return total


def all_plans(n):
    """Every split of range(n) into contiguous [start, stop) runs."""
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        yield list(zip(bounds[:-1], bounds[1:]))


def feasible(lengths, plan, budget, max_batch):
    return all((b - a) <= max_batch and ((b - a) == 1 or (b - a) * max(lengths[a:b]) <= budget)
               for a, b in plan)


@pytest.mark.parametrize("seed", range(12))
def test_plan_is_the_cheapest_feasible_cut(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    n_tokens = np.array([rng.choice([3, 5, 5, 8, 12, 20]) for _ in range(n)], dtype=np.int32)
    ids = [f"{rng.random():.12f}" for _ in range(n)]
    budget, max_batch = rng.choice([16, 40, 100]), rng.choice([2, 4, 1024])
    overhead, width = rng.choice([0, 7, 30, 500]), rng.choice([0, 24])
    order, plan = plan_batches(n_tokens, ids, budget, max_batch, overhead, width)
    lengths = [int(n_tokens[i]) for i in order]
    assert lengths == sorted(lengths, reverse=True)
    assert [s for s, _ in plan] == [0] + [e for _, e in plan[:-1]] and plan[-1][1] == n
    assert feasible(lengths, plan, budget, max_batch)
    best = min(plan_cost(lengths, p, overhead, width) for p in all_plans(n)
               if feasible(lengths, p, budget, max_batch))
    assert plan_cost(lengths, plan, overhead, width) == best


def test_overhead_trades_padding_against_calls():
    n_tokens = np.array([10] * 5 + [9] * 5 + [4] * 20, dtype=np.int32)
    ids = [f"t{i:02d}" for i in range(30)]
    _, cheap_calls = plan_batches(n_tokens, ids, 10_000, 1024, batch_overhead_tokens=1)
    assert cheap_calls == [(0, 5), (5, 10), (10, 30)]  # one batch per exact length: no padding
    _, dear_calls = plan_batches(n_tokens, ids, 10_000, 1024, batch_overhead_tokens=10_000)
    assert dear_calls == [(0, 30)]  # one call, padded to 10
    _, capped = plan_batches(n_tokens, ids, 100, 1024, batch_overhead_tokens=10_000)
    assert capped == [(0, 10), (10, 30)]  # the budget still bounds every batch


def test_resumed_plan_is_the_tail_of_the_full_plan():
    rng = random.Random(3)
    n = 400
    n_tokens = np.array([rng.choice([rng.randint(2, 30), 64]) for _ in range(n)], dtype=np.int32)
    ids = [f"{i:08x}{rng.random()}" for i in range(n)]
    order, plan = plan_batches(n_tokens, ids, 256, 64, 37, 24)
    for k in range(0, len(plan), 5):  # resume after k committed batches
        start = plan[k][0]
        rest = [int(i) for i in order[start:]]
        sub_order, sub_plan = plan_batches(n_tokens[rest], [ids[i] for i in rest], 256, 64, 37, 24)
        assert [rest[i] for i in sub_order] == rest
        assert [(a + start, b + start) for a, b in sub_plan] == plan[k:]
