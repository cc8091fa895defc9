"""A grid's plan: which configurations train, in which stacks, and which are recorded without training.

Heads that share everything but lr, weight decay and seed train together in one stack (`plan_stacks` groups them
by head shape, `stack_key` and array). Combinations that cannot apply to the dataset (a loss the data cannot
train, `--hierarchy` on flat labels) are recorded with status `skipped` and the reason (`why_not`), never
silently dropped. A configuration whose loss reduces to the same objective as an earlier one's on this data
(heads.scoring.losses.objective: under `--graded pearson` on graded pairs, l1-energy and contrastive both train
1 + corr(E, s)), all else alike, would train the very same heads: it is trained once, the plan says so, and its
rows have status `same-objective` and `same_as`, the head id of its trained twin (the leaderboard lists the
objective once, under the first loss). `plan_summary` says it all in one paragraph (`cli grid --dry-run`).
"""
from __future__ import annotations

import json
from dataclasses import asdict

from headstore.heads.experiments.grid.estimate import plan_seconds
from headstore.heads.experiments.grid.spec import GRID_VERSION, UNSET_SINCE_ID, head_id, split_settings
from headstore.heads.kinds import Task, kind_of
from headstore.heads.kinds.labels import shots_clipped, shots_note
from headstore.heads.scoring.losses import LOSSES, applicable, objective
from headstore.heads.settings.config import HeadConfig, TrainConfig, stack_key


def why_not(task: Task, train: TrainConfig) -> str:
    """Why a configuration cannot train on the task ("" when it can): its loss does not take this kind of
    data, or the data cannot serve its settings (e.g. --hierarchy on flat labels)."""
    kind = kind_of(task)
    reason = applicable(train.loss, kind.train_form(task), task.name, task.kind)
    if reason:
        return reason
    try:
        kind.for_training(task, train)
    except ValueError as err:
        return str(err)
    return ""


def of_this_grid(rows: list[dict], combos: list[dict], ids: dict, where: str) -> tuple[list[dict], list[dict]]:
    """(the resumed rows of this grid's configurations, the others): a row of --out whose head id no configuration
    of this grid has (another --store, a configuration since removed from the grid file, an id made before ids held
    the data's contents instead of its path) is kept in the file but never aggregated with these, said in one line."""
    wanted = {head_id(s, **ids) for s in combos}
    mine = [r for r in rows if r["head_id"] in wanted]
    others = [r for r in rows if r["head_id"] not in wanted]
    if others:
        print(f"{where}: {len(others)} row(s) of heads this grid does not define (another --store, a configuration "
              "no longer in the grid file, or ids made before they held the data's contents): kept, not aggregated")
    return mine, others


def plan_stacks(combos: list[dict], task: Task, ids: dict, done: set[str]) -> tuple[dict, list[dict]]:
    """({(head shape, stack key, array): [(head id, head, train, array)]} of the heads still to train,
    rows of the combinations skipped with their reason)."""
    groups: dict[tuple, list] = {}
    skipped = []
    trained_as: dict[tuple, tuple[str, str]] = {}  # (objective, other settings) -> (head id, loss) trained
    for s in combos:
        hid = head_id(s, **ids)
        if hid in done:
            continue
        done.add(hid)
        head, train, array = split_settings(s)
        reason = why_not(task, train)
        if reason:
            skipped.append({"head_id": hid, "grid_version": GRID_VERSION, **flat_settings(head, train, array),
                            "status": "skipped", "reason": reason})
            continue
        twin = objective_key(task, head, train, array)
        if twin in trained_as:
            skipped.append(same_objective_row(hid, head, train, array, twin[0], *trained_as[twin], task))
            continue
        if twin is not None:
            trained_as[twin] = (hid, train.loss)
        key = (json.dumps(asdict(head), sort_keys=True), stack_key(train), array)
        groups.setdefault(key, []).append((hid, head, train, array))
    return groups, skipped


def same_objective_row(hid: str, head: HeadConfig, train: TrainConfig, array: str, objective_name: str,
                       twin_id: str, twin_loss: str, task: Task) -> dict:
    """The results row of a configuration not trained because `twin_id` (loss `twin_loss`) trains the same heads."""
    form = kind_of(task).train_form(task)
    return {"head_id": hid, "grid_version": GRID_VERSION, **flat_settings(head, train, array),
            "status": "same-objective", "same_as": twin_id,
            "reason": f"{train.loss} trains what {twin_loss} trains on {form} pairs under --graded {train.graded} "
                      f"({objective_name}): trained once, as {twin_loss} (same_as: its head id)"}


def objective_key(task: Task, head: HeadConfig, train: TrainConfig, array: str) -> tuple | None:
    """(the shared objective, every other setting) of a configuration whose loss reduces on this task's data to
    an objective other losses reduce to too (heads.scoring.losses.objective); None when it trains its loss's own."""
    kind = kind_of(task)
    form = kind.train_form(task)
    if objective(train.loss, form, train.graded, negatives=False) == train.loss:
        return None  # reduces to nothing shared on this form, whatever the negatives
    negatives = (kind.train_set(task, train.loss).negative is not None  # given, or mined from an IR corpus
                 or bool(train.mined_k and LOSSES[train.loss].negatives and task.corpus_rows is not None))
    name = objective(train.loss, form, train.graded, negatives)
    if name == train.loss:
        return None
    rest = {k: v for k, v in train.to_dict().items() if k != "loss"}
    return name, json.dumps(asdict(head), sort_keys=True), json.dumps(rest, sort_keys=True, default=str), array


def plan_summary(groups: dict, skipped: list[dict], n_done: int, task: Task, store_dim: int) -> str:
    """One paragraph on what a grid will do: heads and stacks to train, skipped and finished ones, configurations
    trained once for two losses (the same objective), a rough time (heads.experiments.grid.estimate)."""
    n_heads = sum(len(items) for items in groups.values())
    same = [r for r in skipped if r["status"] == "same-objective"]
    lines = [f"grid plan: {n_heads} head(s) to train in {len(groups)} stack(s); {len(skipped) - len(same)} skipped "
             f"(cannot apply); {n_done} already finished (resumed)"]
    if same:
        lines.append(f"  trained once: {len(same)} configuration(s) train the very same heads as another loss's "
                     f"({same[0]['reason']}); recorded as same-objective")
    if n_heads:
        rough = sum(plan_seconds(groups, task, store_dim))
        lines.append(f"  rough time on a 2-core CPU: {rough / 60:.1f} min (every epoch run; early stopping shortens "
                     "it; measured again after the first stack)")
    for (_, _, array), items in list(groups.items())[:10]:
        first = items[0][2]
        lines.append(f"  stack of {len(items)}: loss {first.loss}, array {array}, epochs {first.epochs}")
    if len(groups) > 10:
        lines.append(f"  ... and {len(groups) - 10} more stacks")
    lines += [f"  skipped: {r['reason']}" for r in skipped if r["status"] != "same-objective"][:5]
    for shots in sorted({it[2].shots for items in groups.values() for it in items if it[2].shots}):
        clipped = shots_clipped(task, shots)  # more shots than a class has: said, as train-head says it
        if clipped:
            lines.append(f"  note: {shots_note(shots, clipped)}")
    return "\n".join(lines)


def flat_settings(head: HeadConfig, train: TrainConfig, array: str) -> dict:
    """A row's settings; those added since grid rows were first recorded (the levers of issue 20) only
    where set, so the rows (and golden outputs) of grids that do not use them keep their columns."""
    h = {k: v for k, v in asdict(head).items() if k != "in_dim" and UNSET_SINCE_ID.get(k, object()) != v}
    t = {k: v for k, v in train.to_dict().items() if UNSET_SINCE_ID.get(k, object()) != v}
    return {**h, **t, "array": array}
