"""Evaluation, forgetting and the table of `cli compare` (the steps are in `heads.compare`).

Forgetting is the MLM loss on held-out text (general: wikitext-2; in-domain: texts `cli adapt` never
saw), from `featurize.mlm_eval.mlm_loss` on the same masks for every model. Sentence encoders such as
all-MiniLM-L6-v2 ship without an MLM head, and a random head says nothing about the encoder, so a
*probe* head is trained on the frozen base encoder (`cli adapt --head-only`, same steps as the
adaptation) and used to score the base and the fine-tuned encoder; the adapted encoder is scored with
the head it was adapted with. A higher loss than the base's means the encoder moved away from what
the probe decodes (fine-tuning) or predicts that text worse (adaptation).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from tabulate import tabulate

from headstore.data.files import atomic_write_text
from headstore.heads.training.run import eval_head

GENERAL_MIN_CHARS = 50  # wikitext lines shorter than this are headings / fragments


def _name(path: str) -> str:
    return Path(path).name.removesuffix(".parquet")


def evaluate_setups(cfg, out: Path, setups, encoders: dict, heads: dict) -> list[dict]:
    """One row per setup: in-domain test metric, each out-of-domain metric, seconds.

    Each encoder's store is evaluated once per dataset with its head (eval_head also reports the raw
    features' cosine baseline, which is the no-head row)."""
    datasets = [cfg.in_domain, *cfg.out_of_domain]
    evals: dict[tuple[str, str], dict] = {}
    for enc, info in encoders.items():
        for ds in datasets:
            evals[enc, ds] = eval_head(str(info["store"]), str(heads[enc]), ds, str(out / "eval" / enc / _name(ds)),
                                       overwrite=True)  # compare's own folder, rewritten on every run
    rows = []
    for label, enc, head, extra in setups:
        row = {"setup": label, "encoder": enc, "head": None if head is None else str(head),
               "seconds": encoders[enc]["seconds"] + extra, "metrics": {}}
        for ds in datasets:
            m = evals[enc, ds]
            block, metric = (m["head"], m["primary"]) if head is not None else (m["baseline"], m["baseline_primary"])
            row["metrics"][_name(ds)] = {"metric": metric, "value": block[metric], "split": m.get("split", "test")}
        rows.append(row)
    return rows


def _general_texts(cfg) -> list[str]:
    from headstore.featurize.tuning.packing import load_texts

    if not cfg.mlm_text:
        return []
    texts = load_texts(cfg.mlm_text, split=cfg.mlm_text_split or None)
    return [t for t in texts if len(t) >= GENERAL_MIN_CHARS][: cfg.mlm_max_texts]


def _in_domain_held_out(cfg) -> list[str]:
    from headstore.featurize.tuning.packing import load_texts, split_holdout

    _, held = split_holdout(load_texts(cfg.in_domain), cfg.mlm_holdout_fraction)
    return held[: cfg.mlm_max_texts]


def with_head(encoder_dir: Path, head_source: Path, folder: Path) -> Path:
    """A model dir = `encoder_dir`'s files (linked) + `head_source`'s mlm_head.safetensors."""
    from headstore.featurize.tuning.mlm_head import HEAD_FILE

    folder.mkdir(parents=True, exist_ok=True)
    for f in encoder_dir.iterdir():
        if f.is_file() and f.name != HEAD_FILE and not (folder / f.name).exists():
            os.symlink(f.resolve(), folder / f.name)
    if not (folder / HEAD_FILE).exists():
        os.symlink((head_source / HEAD_FILE).resolve(), folder / HEAD_FILE)
    return folder


def mlm_losses(cfg, steps, models: dict, probe: Path) -> dict:
    """{encoder: {"general": loss, "in_domain": loss, "head": ...}} on the same texts and masks."""
    from headstore.featurize.tuning.mlm_eval import mlm_loss

    sets = {"general": _general_texts(cfg), "in_domain": _in_domain_held_out(cfg)}
    results = {}
    for enc, model_dir in models.items():
        scored = model_dir if enc != "finetuned" else with_head(model_dir, probe, steps.out / "mlm-finetuned-model")
        head = {"base": "probe (frozen base)", "adapted": "its own (adapted)", "finetuned": "probe (frozen base)"}[enc]

        def go(folder, scored=scored):
            return {name: mlm_loss(str(scored), texts, max_length=cfg.adapt.max_length, seed=0, n_masks=2)["mlm_loss"]
                    for name, texts in sets.items() if texts}

        _, res = steps.run(f"mlm-{enc}", {"model": str(model_dir), "probe": str(probe), "n": cfg.mlm_max_texts,
                                          "text": cfg.mlm_text, "holdout": cfg.mlm_holdout_fraction}, go)
        results[enc] = {**res, "head": head}
    return results


def write_report(cfg, out: Path, rows: list[dict], mlm: dict, step_seconds: dict) -> str:
    """compare.md and compare.json; returns the markdown table."""
    datasets = [_name(d) for d in [cfg.in_domain, *cfg.out_of_domain]]
    for row in rows:
        row["mlm_loss"] = mlm.get(row["encoder"])
    header = ["setup", *[f"{datasets[0]} (in-domain)"], *[f"{d} (OOD)" for d in datasets[1:]]]
    if mlm:
        header += ["MLM loss general", "MLM loss in-domain held-out"]
    header.append("seconds")
    cells = []
    for row in rows:
        line = [row["setup"], *(f"{row['metrics'][d]['value']:.4f} ({row['metrics'][d]['metric']})" for d in datasets)]
        if mlm:
            mm = row["mlm_loss"] or {}
            line += [f"{mm['general']:.3f}" if "general" in mm else "-",
                     f"{mm['in_domain']:.3f}" if "in_domain" in mm else "-"]
        line.append(f"{row['seconds']:.0f}")
        cells.append(line)
    lines = [tabulate(cells, headers=header, tablefmt="github", disable_numparse=True)]
    notes = [
        "",
        f"In-domain: {cfg.in_domain} (test split); out-of-domain: {', '.join(cfg.out_of_domain) or 'none'} "
        "(test split, or the only split). IR: nDCG@10; STS: Spearman of -E (cosine for no-head rows).",
        "seconds: what producing the setup cost from scratch (featurize / adapt / train-head / finetune; "
        "evaluation excluded). Steps: " + ", ".join(f"{k} {v:.0f} s" for k, v in step_seconds.items()) + ".",
    ]
    if mlm:
        notes.append("MLM loss (mean cross-entropy of masked tokens, same masks for every model): base and "
                     "fine-tuned encoders scored with a probe head trained on the frozen base encoder; the adapted "
                     "encoder with its own head. general = wikitext-2 validation lines, in-domain = texts held out "
                     "of adaptation.")
    table = "\n".join(lines + notes) + "\n"
    atomic_write_text(out / "compare.md", f"# compare: {cfg.model}, heads trained on {_name(cfg.in_domain)}\n\n" + table)
    atomic_write_text(out / "compare.json", json.dumps({"rows": rows, "step_seconds": step_seconds,
                                                  "in_domain": cfg.in_domain, "out_of_domain": list(cfg.out_of_domain),
                                                  "model": cfg.model}, indent=1, default=float))
    return table
