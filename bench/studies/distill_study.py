"""Ensemble -> one head (issue 42 part 2's first goal): a grid's top-K ensemble distilled into one head of the
best single head's shape, per seed, beside that single head and the ensemble, in and out of domain.

For each dataset and seed s: the teacher is the grid's ensemble of seed s (`EnsembleHead.from_grid(GRID, K, s)`:
the seed-s heads of the K best configurations by dev), the best single head is the rank-1 configuration's head of
seed s, and the student has that head's shape and training settings with seed s (`headstore.distill`, every
distillation setting at its default unless --set says otherwise: a DistillConfig setting or a training setting
of the student, e.g. lr=3e-4). --teacher-seeds 0,1,2: the teacher is instead one ensemble for every seed, the K
best configurations' heads of those seeds (K x 3 heads; bench/studies/distill_teachers.py compares teachers).
--tuned-teacher F --single 'COMPARE/head-base-s{seed}-*/head': the teacher is a tuned encoder with its head (a
`cli finetune` output, as a compare step makes it; scored from its own store, --teacher-store), the same for every
seed, and the column "single" is frozen + head of seed s (the compare's head): the share kept is then of the
tuned encoder's gain over frozen + head. Anchors "with" the unlabeled texts (the default
--unlabeled-anchors, drawn from a BEIR task's corpus) and "without" (the task's own training texts only) side by
side where the task has unlabeled texts: SciFact's corpus; for STS-B the sentences of --stsb-unlabeled (featurized
into its store: it otherwise holds none besides SemEval, its test set out of domain), which are then the
candidates' pool in both variants, anchors only in "with".

Reported per dataset and variant: test mean over seeds of frozen, the single head, the teacher and the student,
each with the two-level 95% CI paired by seed (heads.scoring.bootstrap), the student's share of the teacher's gain
over the single head, (student - single) / (teacher - single), with the CI of that ratio from the same resamples;
the out-of-domain figures; parameters and seconds to score 1,000 queries against the corpus. Each finished run
is kept under WORK/runs (a rerun skips it), so a killed study goes on; --summary-only prints what is there.

    cli grid --store S --data DATA/scifact --grid examples/studies/distill/distill-scifact-grid.toml \\
        --out WORK/grid-scifact --transfer DATA/cranfield --transfer DATA/cacm --ensemble 3
    cli grid --store S2 --data DATA/stsb --grid examples/studies/distill/distill-stsb-grid.toml \\
        --out WORK/grid-stsb --transfer DATA/semeval-sts-2012-2016 --ensemble 3
    python3 bench/studies/distill_study.py --work WORK --scifact-store S --stsb-store S2
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))

from headstore.heads.artefacts.files import ensemble_ids  # noqa: E402
from headstore.heads.artefacts.head import EnsembleHead, Head  # noqa: E402
from headstore.heads.experiments.compare.datasets_root import datasets_root  # noqa: E402
from headstore.heads.experiments.distill.run import distill  # noqa: E402
from headstore.heads.scoring.bootstrap import SEED_STREAM, item_statistics, two_level_ci  # noqa: E402
from headstore.heads.settings.config import HeadConfig, TrainConfig  # noqa: E402
from headstore.heads.settings.distill import DistillConfig  # noqa: E402
from limits import machine, machine_line  # noqa: E402

DATASETS = {  # name: (transfer sets, the per-item statistic of the primary metric, variants)
    "scifact": (("cranfield", "cacm"), "mean", ("with", "without")),
    "stsb": (("semeval-sts-2012-2016",), "spearman", ("with", "without")),  # "with": given --stsb-unlabeled
}
COLUMNS = ("frozen", "single", "teacher", "distilled")
N_BOOT = 1000
# a share's CI from resamples whose teacher gain is <= 0 dropped is a CI of another (conditioned) distribution:
# above this fraction dropped, no CI is given ("gain not resolved": the teacher's gain is not above 0 in the data)
MAX_DROPPED = 0.05


def parse_settings(pairs: list[str]) -> dict:
    """["temperature=2", "lr=3e-4", "hidden=1024"] -> typed settings: DistillConfig's, or the student's training
    settings (TrainConfig's) or shape (HeadConfig's), each applied over the single head's."""
    train, shape = TrainConfig().to_dict(), asdict(HeadConfig())
    out = {}
    for k, v in (p.split("=", 1) for p in pairs):
        default = getattr(DistillConfig(), k) if hasattr(DistillConfig(), k) else train.get(k, shape.get(k))
        if default is None:
            raise SystemExit(f"--set {k}: no DistillConfig, TrainConfig or HeadConfig setting of that name (or one "
                             "without a default to type it by)")
        out[k] = v.lower() in ("1", "true") if isinstance(default, bool) else type(default)(v)
    return out


def teacher_of(args, name: str, seed: int) -> str:
    """The teacher's folder name under WORK/teachers (runs are named after it): the top-K configurations' heads of
    --teacher-seeds (default: the student's own seed); K 3 of the own seed keeps the first study's name."""
    if getattr(args, "tuned_teacher", None):
        return f"tuned-{Path(args.tuned_teacher).name}"
    seeds = getattr(args, "teacher_seeds", None)
    if not seeds:
        return f"{name}-seed{seed}" if args.k == 3 else f"{name}-top{args.k}-seed{seed}"
    return f"{name}-top{args.k}-seeds{seeds.replace(',', '-')}"


def save_teacher(grid: Path, k: int, seed: int, teacher_seeds: str | None, out: Path) -> None:
    """The grid's ensemble of seed `seed`, or of every one of `teacher_seeds` (K x seeds heads, one teacher)."""
    if not teacher_seeds:
        EnsembleHead.from_grid(grid, k, seed=seed).save(out)
        return
    refs = [f"{grid}#id={i}" for s in map(int, teacher_seeds.split(",")) for i in ensemble_ids(grid, k, s)]
    members = [Head.load(r) for r in refs]
    EnsembleHead(members, {"grid": str(grid), "k": k, "seeds": teacher_seeds,
                           "rule": "the K best configurations by mean dev metric; their heads of every seed"},
                 f"{grid}#ensemble={k}, seeds {teacher_seeds}").save(out)


def check_kept(done: Path, dcfg: DistillConfig, cfg, head_cfg: HeadConfig) -> None:
    """A kept run is reused only when made with these settings, every one resolved (data/keys.py's rule: a default
    changed since is a difference; then another --tag)."""
    made = json.loads((done / "head" / "config.json").read_text())
    differ = {k: (made["distill"].get(k), v) for k, v in dcfg.to_dict().items() if made["distill"].get(k) != v}
    differ |= {k: (made["train"].get(k), v) for k, v in cfg.to_dict().items() if made["train"].get(k) != v}
    differ |= {k: (made["head"].get(k), getattr(head_cfg, k)) for k in ("depth", "hidden")
               if made["head"].get(k) != getattr(head_cfg, k)}
    if differ:
        raise SystemExit(f"{done} was made with other settings (kept, asked): {differ}; give another --tag")


def single_of(pattern: str, seed: int) -> str:
    """--single's head of `seed`: the pattern with {seed} filled, a glob that must match one folder."""
    found = sorted(glob.glob(pattern.format(seed=seed)))
    if len(found) != 1:
        raise SystemExit(f"--single {pattern}: {len(found)} folders match for seed {seed} ({found[:3]}); give one each")
    return found[0]


def run_dir(args, name: str, seed: int, variant: str) -> Path:
    """WORK/runs/TAG/<teacher>-<variant>-seed<s>: where one distillation's record is kept."""
    teacher = teacher_of(args, name, seed).replace(f"-seed{seed}", "")
    return Path(args.work) / "runs" / args.tag / f"{teacher}-{variant}-seed{seed}"


def run_one(args, name: str, seed: int, variant: str, settings: dict, transfer: bool = True) -> dict:
    """One distillation (module doc), kept under WORK/runs/TAG: its metrics and per-item test values."""
    work = Path(args.work)
    teacher_name = teacher_of(args, name, seed)
    done = run_dir(args, name, seed, variant)
    grid = work / f"grid-{name}"
    tuned = getattr(args, "tuned_teacher", None)  # a tuned encoder: the same teacher for every seed
    single_ref = single_of(args.single, seed) if tuned else f"{grid}#id={ensemble_ids(grid, 1, seed)[0]}"
    single = Head.load(single_ref)
    train = {k: v for k, v in settings.items() if k in set(TrainConfig.keys())}
    shape = {k: v for k, v in settings.items() if k in asdict(HeadConfig()) and k not in train}
    cfg = single.train_config.replace(**train, seed=seed)
    head_cfg = replace(single.head_config, **shape)  # the single head's shape unless --set widens it
    dcfg = DistillConfig(**{**{k: v for k, v in settings.items() if k not in train and k not in shape},
                            **({"unlabeled_anchors": 0} if variant == "without" else {})})
    if (done / "record.json").is_file():
        check_kept(done, dcfg, cfg, head_cfg)
        return json.loads((done / "record.json").read_text()) | {"items": dict(np.load(done / "items.npz"))}
    teacher_dir = Path(tuned) if tuned else work / "teachers" / teacher_name
    if not teacher_dir.is_dir():
        save_teacher(grid, args.k, seed, getattr(args, "teacher_seeds", None), teacher_dir)
    store = getattr(args, f"{name}_store")
    items: dict = {}
    root = datasets_root()
    unlabeled = tuple(u for u in [getattr(args, f"{name}_unlabeled", None)] if u)
    metrics = distill(store, str(root / name), str(teacher_dir), str(done / "head"), head_cfg, cfg, dcfg,
                      progress=False, overwrite=True, unlabeled=unlabeled, single=single_ref, items=items,
                      teacher_store=getattr(args, "teacher_store", None),
                      transfer=tuple(str(root / t) for t in DATASETS[name][0] if transfer))
    record = {"dataset": name, "seed": seed, "variant": variant, "distill": settings, "unlabeled": list(unlabeled),
              "primary": metrics["primary"], "baseline_primary": metrics["baseline_primary"],
              "test": {"frozen": metrics["baseline"][metrics["baseline_primary"]],
                       **{c: metrics[c]["head"][metrics[c]["primary"]] for c in ("single", "teacher")},
                       "distilled": metrics["head"][metrics["primary"]]},
              "dev": {"frozen": metrics["dev"]["baseline"][metrics["baseline_primary"]],
                      **{c: metrics[c]["dev"][metrics[c]["primary"]] for c in ("single", "teacher")},
                      "distilled": metrics["dev"]["head"][metrics["primary"]]},
              "transfer": {c: (metrics["distill"] if c == "distilled" else metrics[c])["transfer"] for c in COLUMNS},
              "parameters": {c: (metrics["distill"] if c == "distilled" else metrics[c])["parameters"] for c in COLUMNS},
              "seconds_per_1000": {c: (metrics["distill"] if c == "distilled" else metrics[c])["seconds_per_1000"]
                                   for c in COLUMNS},
              "anchors": metrics["distill"]["anchors"], "train_seconds": metrics["distill"]["train_seconds"],
              "best_epoch": metrics["distill"]["best_epoch"], "single_ref": single_ref, "teacher": str(teacher_dir)}
    np.savez(done / "items.npz", **items)
    (done / "record.json").write_text(json.dumps(record, indent=1))
    return record | {"items": items}


def share_ci(items: dict, statistic: str) -> dict:
    """95% interval of mean(student - single) / mean(teacher - single) over seeds, from the two-level bootstrap's
    resamples (the same item draws for every system, the seeds drawn as pairs: bootstrap.seed_interval's draw).

    A ratio is a share only where the teacher's gain is above 0: the other resamples are dropped, and their
    fraction is said ("dropped"). Above MAX_DROPPED no interval is given ("ci" None, "note": the gain is not
    resolved): the quantiles of what is left would be those of a distribution conditioned on a gain the data do
    not establish (on synthetic data with a small gain, 11% of 1,000 were dropped and the interval looked tight)."""
    gold = items.get("gold")
    boot = {c: item_statistics(items[c], N_BOOT, 0, gold=gold, statistic=statistic) for c in ("single", "teacher",
                                                                                             "distilled")}
    S = boot["single"].shape[0]
    seeds = np.random.default_rng([0, SEED_STREAM]).multinomial(S, np.full(S, 1.0 / S), size=N_BOOT)  # (B, S)
    gain = lambda c: (seeds * (boot[c] - boot["single"]).T).sum(1) / S  # noqa: E731
    teacher = gain("teacher")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = gain("distilled") / teacher
    kept = np.isfinite(ratio) & (teacher > 0)
    dropped = float(1.0 - kept.mean())
    out = {"dropped": dropped, "resamples": N_BOOT}
    if dropped > MAX_DROPPED:
        return {**out, "ci": None, "note": f"gain not resolved: the teacher's gain is <= 0 in {dropped:.1%} of the "
                                           f"{N_BOOT} resamples (no share CI above {MAX_DROPPED:.0%})"}
    return {**out, "ci": [float(np.quantile(ratio[kept], 0.025)), float(np.quantile(ratio[kept], 0.975))]}


def share_words(share: float | None, ci: dict | None) -> str:
    """'76% [-17%, +133%] (1.2% of resamples dropped)', or '76% (gain not resolved: ...)'; '–' without a share."""
    if share is None:
        return "–"
    if not ci:
        return f"{share:.0%}"
    if ci["ci"] is None:
        return f"{share:.0%} ({ci['note']})"
    lo, hi = ci["ci"]
    return f"{share:.0%} [{lo:.0%}, {hi:.0%}] ({ci['dropped']:.1%} of resamples dropped: teacher gain <= 0)"


def summarize(records: list[dict]) -> list[dict]:
    """One row per dataset and variant: means over seeds, CIs, the share of the teacher's gain kept."""
    rows = []
    for name, variant in sorted({(r["dataset"], r["variant"]) for r in records}):
        rs = sorted((r for r in records if (r["dataset"], r["variant"]) == (name, variant)), key=lambda r: r["seed"])
        statistic = DATASETS[name][1]
        items = {c: np.stack([r["items"][c] for r in rs]) for c in COLUMNS}
        items["gold"] = rs[0]["items"].get("gold")
        gold = None if statistic == "mean" else items["gold"]
        mean = {c: float(np.mean([r["test"][c] for r in rs])) for c in COLUMNS}
        row = {"dataset": name, "variant": variant, "seeds": [r["seed"] for r in rs], "test": mean,
               "test_std": {c: float(np.std([r["test"][c] for r in rs])) for c in COLUMNS},
               "ci": {c: two_level_ci(items[c], N_BOOT, gold=gold, statistic=statistic) for c in COLUMNS},
               "distilled_minus_single_ci": two_level_ci(items["distilled"], N_BOOT, gold=gold, statistic=statistic,
                                                         minus=items["single"]),
               "teacher_minus_single_ci": two_level_ci(items["teacher"], N_BOOT, gold=gold, statistic=statistic,
                                                       minus=items["single"]),
               "dev": {c: float(np.mean([r["dev"][c] for r in rs])) for c in COLUMNS},
               "transfer": {c: {t: float(np.mean([r["transfer"][c][t] for r in rs])) for t in rs[0]["transfer"][c]}
                            for c in COLUMNS},
               "parameters": rs[0]["parameters"],
               "seconds_per_1000": {c: float(np.median([r["seconds_per_1000"][c] for r in rs])) for c in COLUMNS},
               "anchors": rs[0]["anchors"], "train_seconds": [r["train_seconds"] for r in rs]}
        gain = mean["teacher"] - mean["single"]
        row["share"] = (mean["distilled"] - mean["single"]) / gain if gain > 0 else None
        row["share_ci"] = share_ci({**items, "gold": gold}, statistic) if gain > 0 and len(rs) > 1 else None
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    from tabulate import tabulate

    out = []
    for r in rows:
        lines = []
        for c in COLUMNS:
            ci = r["ci"][c]
            lines.append((c, f"{r['dev'][c]:.4f}", f"{r['test'][c]:.4f} ± {r['test_std'][c]:.4f}",
                          f"[{ci[0]:.4f}, {ci[1]:.4f}]", *(f"{v:.4f}" for v in r["transfer"][c].values()),
                          f"{r['parameters'][c]:,}", f"{r['seconds_per_1000'][c]:.2f}"))
        a = r["anchors"]
        head = (f"{r['dataset']}, anchors {r['variant']} the unlabeled texts ({a['task_anchors']} task + "
                f"{a['unlabeled_anchors']} unlabeled), seeds {r['seeds']}")
        share = share_words(r["share"], r["share_ci"])
        d, t = r["distilled_minus_single_ci"], r["teacher_minus_single_ci"]
        foot = (f"share of the teacher's gain over the single head kept: {share}; distilled - single 95% CI "
                f"[{d[0]:+.4f}, {d[1]:+.4f}], teacher - single [{t[0]:+.4f}, {t[1]:+.4f}]")
        out.append("\n".join([head, tabulate(lines, headers=["", "dev", "test mean ± std", "test 95% CI",
                                                               *r["transfer"]["frozen"], "parameters",
                                                               "s / 1,000 queries"], disable_numparse=True), foot]))
    return "\n\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="Holds grid-<dataset>/ (the teacher grids); runs go under it.")
    parser.add_argument("--scifact-store", default=None)
    parser.add_argument("--stsb-store", default=None)
    parser.add_argument("--stsb-unlabeled", default=None, help="Unlabeled sentences for STS-B (in --stsb-store): "
                        "the 'with' variant's anchors, both variants' candidates. Without it: 'without' only.")
    parser.add_argument("--datasets", default="scifact,stsb")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--variants", default="with,without", help="Anchors with and/or without the unlabeled texts.")
    parser.add_argument("--k", type=int, default=3, help="Ensemble size (the grid's --ensemble K).")
    parser.add_argument("--teacher-seeds", default=None, help="The teacher: the top-K configurations' heads of "
                        "these seeds (e.g. 0,1,2), one teacher for every student seed. Default: the student's seed.")
    parser.add_argument("--tuned-teacher", default=None, help="A tuned encoder as the teacher of every seed: a `cli "
                        "finetune` output (a compare step's); its scores from --teacher-store. Needs --single.")
    parser.add_argument("--teacher-store", default=None, help="The tuned encoder's store (default: beside it).")
    parser.add_argument("--single", default=None, help="With --tuned-teacher: the head the student is measured "
                        "against and shaped like, a path (a glob matching one folder) with {seed}, e.g. the compare's "
                        "frozen + head 'COMPARE/head-base-s{seed}-*/head'")
    parser.add_argument("--set", action="append", default=[], help="A DistillConfig setting, e.g. temperature=2, "
                        "or a training setting or the shape of the student, e.g. lr=3e-4, hidden=1024.")
    parser.add_argument("--tag", default="defaults", help="Runs go under WORK/runs/TAG (one per --set).")
    parser.add_argument("--summary-only", action="store_true", help="Summarise the runs WORK holds; train none.")
    parser.add_argument("--json", default=None, help="Default: bench/results/distill-study-<cpu>-<date>.json.")
    args = parser.parse_args()
    if bool(args.tuned_teacher) != bool(args.single):
        parser.error("--tuned-teacher and --single go together")
    settings = parse_settings(args.set)
    m = machine()
    print(machine_line(m))
    records = []
    for name in args.datasets.split(","):
        variants = [v for v in DATASETS[name][2] if v in args.variants.split(",")]
        if name == "stsb" and not args.stsb_unlabeled:
            variants = [v for v in variants if v != "with"]
        for variant in variants:
            for seed in map(int, args.seeds.split(",")):
                if args.summary_only and not (run_dir(args, name, seed, variant) / "record.json").is_file():
                    continue
                records.append(run_one(args, name, seed, variant, settings))
                print(f"{name} {variant} seed {seed}: {records[-1]['test']}", flush=True)
    rows = summarize(records)
    print(table(rows))
    date = datetime.date.today().isoformat()
    path = Path(args.json or Path(__file__).resolve().parents[1] / "results" / f"distill-study-zen4-{date}.json")
    path.write_text(json.dumps({"date": date, "machine": m, "k": args.k, "settings": settings, "rows": rows,
                                "runs": [{k: v for k, v in r.items() if k != "items"} for r in records]},
                               indent=1, default=float))
    print(f"written: {path}")


if __name__ == "__main__":
    main()
