"""Golden outputs: every number today's headstore computes on the scenarios of scenarios.py (train-head on
each kind of data, a layer mix, eval, grids, export, index and search) equals the one recorded in
the golden file of this CPU's kind (tests/golden/record.py: golden.json without avx512f, golden-avx512f.json
with it; first recorded before the heads/ redesign), so a change can prove it changed no number. Floats agree
to 1e-6 with the file of this CPU's kind, to 1e-4 where only the other kind's exists (its matmul kernels round
differently; a tie flipped in a tiny ranking can move a metric more); every other leaf, and the set of keys,
exactly."""
from __future__ import annotations

import json
import math

import pytest

from .record import cpu_info, golden_path
from .scenarios import run_all

_OWN = golden_path(cpu_info()["avx512f"])
RECORDED = json.loads((_OWN if _OWN.exists() else golden_path(not cpu_info()["avx512f"])).read_text())
SAME_CPU = cpu_info()["avx512f"] == RECORDED["cpu"]["avx512f"]
TOL = 1e-6 if SAME_CPU else 1e-4
WHY = "" if SAME_CPU else (f" (tolerance {TOL}: this CPU's avx512f differs from the recording CPU's, "
                            f"{RECORDED['cpu']['model']})")


# What the redesign changed on purpose, each applied to both sides before comparing (nothing else may differ):
# labelled-text grids now run through the one grid runner, whose head ids hash the settings as every grid's
# do (the store dim, the data format) and whose rows carry its usual columns (grid_version, stack_index,
# test_primary): the label grid's rows are matched by their numeric settings instead of by head id (the
# recorded rows keep no string column, so the two losses of one shots/seed pair are matched as a set).
LABEL_GRID_NEW_COLUMNS = {"head_id", "grid_version", "stack_index", "test_primary"}


def label_rows_matched(got: list[dict], want: list[dict]) -> list[dict]:
    """`got`'s rows without the new columns, reordered to face the recorded row they equal (by shots/seed,
    then the order whose rows differ least)."""
    strip = lambda r: {k: v for k, v in r.items() if k not in LABEL_GRID_NEW_COLUMNS}  # noqa: E731
    pool = [strip(r) for r in got]
    out = []
    for w in map(strip, want):
        same = [r for r in pool if (r["shots"], r["seed"]) == (w["shots"], w["seed"])] or pool
        best = min(same, key=lambda r: len(list(differences(r, w, ""))))
        pool.remove(best)
        out.append(best)
    return out + pool


# metrics.json keys and grid columns issue 21 added on purpose (how negatives were mined, how dev was ranked each
# epoch, which heads were ranked on test): new keys beside the recorded ones, no recorded number moves; dropped
# from `got` wherever the record lacks them; "device" (where features and heads were held: --device) and
# "test_scope" (the --test-scope a grid head was scored under)
ISSUE21_KEYS = {"negatives", "dev_candidates", "dev_ranked", "test_scored", "device", "test_scope"}
# and issue 53's (seen / unseen): each split's "parts" (its figures again on seen and unseen queries), "parts_note"
# (a head without its judgements), "judged" (the judgements a head folder keeps; an index's judged share)
ISSUE53_KEYS = {"parts", "parts_note", "judged"}


def without_new_keys(got, want):
    if isinstance(got, dict) and isinstance(want, dict):
        return {k: without_new_keys(v, want.get(k)) for k, v in got.items()
                if k in want or k not in ISSUE21_KEYS | ISSUE53_KEYS}
    if isinstance(got, list) and isinstance(want, list):
        return [without_new_keys(g, w) for g, w in zip(got, want)] + got[len(want):]
    return got


def intended(scenario: str, got: dict, want: dict) -> tuple[dict, dict]:
    got = without_new_keys(got, want)
    if scenario == "export":  # issue 53: a safetensors export keeps the head's judgements.parquet beside it
        got = {**got, "safetensors_files": [f for f in got["safetensors_files"] if f != "judgements.parquet"]}
    if scenario == "grid_labels":
        strip = lambda r: {k: v for k, v in r.items() if k not in LABEL_GRID_NEW_COLUMNS}  # noqa: E731
        return ({**got, "rows": label_rows_matched(got["rows"], want["rows"])},
                {**want, "rows": [strip(r) for r in want["rows"]]})
    return got, want


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return json.loads(json.dumps(run_all(tmp_path_factory.mktemp("golden"))))  # as record.py stores them


def differences(got, want, path: str):
    """Every leaf where `got` differs from `want`, as 'path: got ... recorded ...' lines."""
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            yield (f"{path}: keys differ; new {sorted(set(got) - set(want))}, "
                   f"missing {sorted(set(want) - set(got))}")
        for key in sorted(set(got) & set(want)):
            yield from differences(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            yield f"{path}: length {len(got)}, recorded {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            yield from differences(g, w, f"{path}[{i}]")
    elif isinstance(want, float) and isinstance(got, float):
        if not (math.isnan(got) and math.isnan(want)) and not abs(got - want) <= TOL:
            yield f"{path}: {got!r}, recorded {want!r} (|diff| {abs(got - want):.3g} > {TOL}){WHY}"
    elif type(got) is not type(want) or got != want:
        yield f"{path}: {got!r}, recorded {want!r}"


def test_same_scenarios(results):
    assert set(results) == set(RECORDED) - {"cpu"}


@pytest.mark.parametrize("scenario", sorted(set(RECORDED) - {"cpu"}))
def test_scenario_matches_golden(results, scenario):
    assert scenario in results, f"scenario {scenario} no longer runs"
    got, want = intended(scenario, results[scenario], RECORDED[scenario])
    diffs = list(differences(got, want, scenario))
    assert not diffs, f"{len(diffs)} difference(s) from golden.json:\n" + "\n".join(diffs[:50])
