"""`cli distill`: a teacher (a head, an ensemble, GRID#ensemble=K) distilled into one head (registered by cli.py)."""
from __future__ import annotations

import click

from headstore.data.options import PATH, format_option, unlabeled_option
from headstore.featurize.encoder.config import DEVICES
from headstore.heads.scoring.losses import DISTILL_LOSSES, DISTILL_SEPARATOR
from headstore.heads.settings.distill import STUDENT_INITS, DistillConfig
from headstore.heads.settings.options import configs_from_options, head_and_train_options, named_as_typed

D = DistillConfig()


def distill_options(f):
    """The settings of DistillConfig as options (their defaults and why: heads.settings.distill)."""
    losses = " | ".join([*DISTILL_LOSSES, DISTILL_SEPARATOR.join(DISTILL_LOSSES)])
    options = [
        click.option("--distill-loss", default=D.distill_loss, show_default=True,
                     help=f"{losses}: KL on softmax(-E / T) over each candidate set (Hinton et al. 2015), the "
                          "teacher's margins to its best candidate (Margin-MSE, Hofstätter et al. 2020), the "
                          "anchors' outputs regressed onto the teacher's (embedding-MSE, Reimers & Gurevych 2020: "
                          "a student of the teacher's output width), or a sum."),
        click.option("--temperature", type=float, default=D.temperature, show_default=True,
                     help="T of the KL's softmax over -energy (> 0)."),
        click.option("--pair-weight", type=float, default=D.pair_weight, show_default=True,
                     help="Weight of the pairs' own loss (train-head's) added to the distillation loss (0: none)."),
        click.option("--teacher-k", type=int, default=D.teacher_k, show_default=True,
                     help="Candidates per anchor from the teacher's own top-k of the frozen search."),
        click.option("--random-k", type=int, default=D.random_k, show_default=True,
                     help="Random corpus texts added to each anchor's candidates."),
        click.option("--search-k", type=int, default=D.search_k, show_default=True,
                     help="Texts of the frozen (cosine) search the teacher re-scores per anchor."),
        click.option("--unlabeled-anchors", type=int, default=D.unlabeled_anchors, show_default=True,
                     help="Anchors drawn from the unlabeled texts (--unlabeled, else a BEIR corpus) beside the "
                          "task's own training texts."),
        click.option("--student-init", type=click.Choice(STUDENT_INITS), default=D.student_init, show_default=True,
                     help="fresh: a new head of the shape options; single: start from the best single head beside "
                          "(its shape and weights; the guard keeps it where distillation loses on dev)."),
        click.option("--sample-seed", type=int, default=D.sample_seed, show_default=True,
                     help="Seed of the unlabeled anchors and random candidates (not the head's --seed: seeds of "
                          "the student share one set of targets)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@click.command("distill")
@click.option("--store", type=PATH, required=True, help="Feature store written by `cli featurize`.")
@click.option("--data", type=PATH, required=True, help="Dataset (BEIR folder, pairs or STS table) whose texts are in "
              "the store: its train texts are anchors, dev selects, test is reported once.")
@format_option
@unlabeled_option
@click.option("--teacher", type=PATH, required=True, help="A head or ensemble folder, GRID#rank=K, GRID#ensemble=K "
              "(K >= 2) trained over this store, or a tuned encoder with its head (a `cli finetune` output).")
@click.option("--teacher-store", type=PATH, default=None, help="A tuned-encoder teacher's own store of the same texts "
              "(default: FINETUNE_OUT/store-<its fingerprint>); texts it lacks are encoded into it first (said, with "
              "an estimated time).")
@click.option("--out", type=PATH, required=True, help="Output: the distilled head (as train-head's) and the "
              "teacher's targets cache (a rerun reuses it).")
@click.option("--transfer", type=PATH, multiple=True, help="Out-of-domain dataset (texts in the store) every column "
              "is also scored on (repeatable; its items sharing a text with --data dropped, counted).")
@click.option("--single", type=PATH, default=None, help="The best single pair-trained head to show beside (default: an "
              "ensemble teacher's member with the best dev figure).")
@click.option("--array", default="features", show_default=True, help="Store array the student trains on.")
@click.option("--overwrite", is_flag=True, help="Replace a head --out already holds (the targets cache is kept: keyed).")
@click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True,
              help="Where the features, the teacher and the student live (auto: cuda when available).")
@distill_options
@head_and_train_options
def distill_command(store, data, data_format, unlabeled, teacher, teacher_store, out, transfer, single, array,
                    overwrite, device, **settings):
    """Distil a teacher's energies into one head on the frozen features: soft targets over each anchor's
    candidate set (the teacher's top-k of the frozen search plus random texts), selected on dev, test once."""
    from headstore.heads.experiments.distill.run import distill

    names = ("distill_loss", "temperature", "pair_weight", "teacher_k", "random_k", "search_k", "unlabeled_anchors",
             "sample_seed", "student_init")
    with named_as_typed():
        dcfg = DistillConfig(**{k: settings.pop(k) for k in names})
    head_cfg, cfg, unset, _ = configs_from_options(settings)
    metrics = distill(store, data, teacher, out, head_cfg, cfg, dcfg, data_format, array, overwrite=overwrite,
                      kind_defaults=unset, device=device, unlabeled=tuple(unlabeled), transfer=tuple(transfer),
                      single=single, teacher_store=teacher_store)
    click.echo(distill_table(metrics))
    click.echo(f"full metrics: {out}/metrics.json")


def _fmt(value, ci=None) -> str:
    if value is None:
        return "–"
    return f"{value:.4f}" + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci and len(ci) == 2 else "")


def _columns(metrics: dict) -> list[tuple[str, dict]]:
    """(header, column) of frozen, the best single head (when any), the teacher and the distilled head."""
    from headstore.heads.experiments.distill.report import split_parts

    d, base = metrics["distill"], metrics["baseline_primary"]
    student = {"primary": metrics["primary"], "head": metrics.get("head"), "ci": metrics.get("ci", {}).get("head"),
               "dev": metrics.get("dev", {}).get("head"), **d, **split_parts(metrics)}
    frozen = {**metrics.get("frozen", {}), "primary": base, "head": metrics.get("baseline"),
              "ci": metrics.get("ci", {}).get("baseline"), "dev": metrics.get("dev", {}).get("baseline")}
    cols = [(f"frozen {base}", frozen)]
    if metrics.get("single"):
        cols.append((f"best single {metrics['single']['primary']}", metrics["single"]))
    return cols + [(f"teacher {metrics['teacher']['primary']}", metrics["teacher"]), (f"distilled {metrics['primary']}",
                                                                                      student)]


def distill_table(metrics: dict) -> str:
    """frozen | best single | teacher | distilled: dev, test (95% CIs), each --transfer set, parameters and the
    seconds to score 1,000 queries against the corpus; then the share of the teacher's gain kept."""
    from tabulate import tabulate

    cols = _columns(metrics)
    rows = [("dev", *(_fmt((c.get("dev") or {}).get(c["primary"])) for _, c in cols))] if "dev" in metrics else []
    if "head" in metrics:
        rows.append(("test", *(_fmt((c.get("head") or {}).get(c["primary"]), c.get("ci")) for _, c in cols)))
    for name in metrics["distill"].get("transfer", {}):
        rows.append((f"{name} (out of domain)", *(_fmt(c.get("transfer", {}).get(name)) for _, c in cols)))
    rows += part_rows(cols)
    rows.append(("parameters", *(f"{c.get('parameters', 0):,}" for _, c in cols)))
    rows.append(("s / 1,000 queries", *(f"{c['seconds_per_1000']:.3f}" if "seconds_per_1000" in c else "–"
                                        for _, c in cols)))
    table = tabulate(rows, headers=["", *(h for h, _ in cols)], disable_numparse=True)
    d = metrics["distill"]
    a = d["anchors"]
    held_out = (f" ({a['unlabeled_held_out']} of them left out: texts a dev or test item scores)"
                if a.get("unlabeled_held_out") else "")
    lines = [table, f"anchors: {a['task_anchors']} of the task, {a['unlabeled_anchors']} from {a['unlabeled_from']}"
             f"{held_out}; "
             f"{d['candidates_per_anchor']} candidates each (corpus {a['corpus']:,}); teacher targets "
             f"{'made' if d['targets_made'] else 'reused'} ({d['targets']}); {d['distill_loss']}, T {d['temperature']:g}"]
    share = gain_share(metrics)
    if share is not None:
        lines.append(f"the distilled head keeps {share:.0%} of the teacher's test gain over the best single head")
    return "\n".join([*lines, *(f"WARNING: {w}" for w in metrics.get("warnings", []))])


def part_rows(cols: list[tuple[str, dict]]) -> list[tuple]:
    """The dev and test rows of the seen and unseen queries (heads.kinds.seen): each head's figure, the frozen
    column's from the distilled head's parts (the same baseline beside every head)."""
    parts = cols[-1][1].get("parts", {})
    rows = []
    for split, by_part in parts.items():
        for part in ("seen", "unseen"):
            if not by_part[part]["n"]:
                continue
            values = [((c.get("parts") or {}).get(split) or {}).get(part, {}).get("head") for _, c in cols[1:]]
            rows.append((f"{split} {part} ({by_part[part]['n']})", _fmt(by_part[part]["baseline"]),
                         *(_fmt(v) for v in values)))
    return rows


def gain_share(metrics: dict) -> float | None:
    """(distilled - single) / (teacher - single) on test; None without a single head or a teacher gain."""
    single, teacher = metrics.get("single"), metrics["teacher"]
    if not single or "head" not in metrics or not single.get("head"):
        return None
    s, t = single["head"][single["primary"]], teacher["head"][teacher["primary"]]
    return None if t <= s else (metrics["head"][metrics["primary"]] - s) / (t - s)
