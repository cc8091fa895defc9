"""Evaluation and forgetting of `cli compare` (the steps are in `heads.experiments.compare.run`, the table in
`heads.experiments.compare.table`).

Each encoder at each seed is evaluated once per dataset with its head (eval_head also scores the raw
features' cosine, the no-head row); the per-query / per-pair values are kept in the eval step's record
so that a rerun computes every CI again without scoring anything.

Forgetting is the MLM loss on held-out text (general: wikitext-2; in-domain: texts `cli adapt` never
saw), from `featurize.mlm_eval.mlm_loss` on the same masks for every model. Sentence encoders such as
all-MiniLM-L6-v2 ship without an MLM head, and a random head says nothing about the encoder, so a
*probe* head is trained on the frozen base encoder (`cli adapt --head-only`) and used to score the base
and every encoder tuned on the task; the MLM-adapted encoder (which starts from the probe's head) is
scored with its own head. A higher loss than the base's means the encoder moved away from what the
probe decodes (tuning on the task) or predicts that text worse (adaptation). A tuned encoder with the probe's
head is a folder of links made inside its MLM step's own folder, whose key holds the keys of the steps that
made the encoder and the probe: a changed encoder or probe is a new step with new links, never old ones.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from headstore.data.keys import content_digest, contents
from headstore.heads.experiments.compare.config import device_key, mlm_loss_device
from headstore.heads.training.eval_run import eval_head

DATA = "--in-domain / --ood ([data] in_domain / out_of_domain)"  # what a missing dataset's error names
GENERAL_MIN_CHARS = 50  # wikitext lines shorter than this are headings / fragments
MLM_MASKS = {"seed": 0, "n_masks": 2}  # the same masks for every model: two draws of them per text


def _name(path: str) -> str:
    return Path(path).name.removesuffix(".parquet")


def dataset_name(path: str) -> str:
    return _name(path)


def _eval(store: Path, head: Path, data: str, folder: Path, exclude: str | None, device: str = "auto") -> dict:
    items: dict = {}
    m = eval_head(str(store), str(head), data, str(folder / "eval"), exclude_overlap=exclude, overwrite=True,
                  items=items, device=device)
    return {"metric": m["primary"], "value": m["head"][m["primary"]], "baseline_metric": m["baseline_primary"],
            "baseline": m["baseline"][m["baseline_primary"]], "split": m["split"],
            "n_scored": m["n_scored"].get(m["split"]), "dropped": m.get("overlap_dropped"),
            "items": {"head": items["head"], "baseline": items["baseline"]}, "gold": items.get("gold"),
            "seen": items.get("seen")}  # the items' seen mask (heads.experiments.compare.parts)


def evaluate_built(cfg, steps, built: dict) -> dict:
    """{(encoder, seed, dataset name): eval record} for every encoder at every seed that has a head.

    Out-of-domain datasets drop the pairs / queries that use an in-domain text when
    `ood_exclude_overlap` (SemEval holds STS-B's sentences)."""
    datasets = [cfg.in_domain, *cfg.out_of_domain]
    evals = {}
    for enc, per_seed in built.items():
        for seed, b in per_seed.items():
            head = next(iter(b.heads.values()))
            for ds in datasets:
                exclude = cfg.in_domain if cfg.ood_exclude_overlap and ds != cfg.in_domain else None
                settings = {"store": steps.key_of(b.store), "head": steps.key_of(head), "data": content_digest(ds, DATA),
                            "exclude_overlap": contents(exclude, DATA), **device_key(cfg)}
                assert None not in (settings["store"], settings["head"]), (b.store, head)  # made by steps of this run
                _, evals[enc, seed, _name(ds)] = steps.run(
                    f"eval-{enc}-s{seed}-{_name(ds)}", settings,
                    lambda d, b=b, head=head, ds=ds, exclude=exclude: _eval(b.store, head, ds, d, exclude, cfg.device),
                    "eval")
    return evals


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
    """A model dir, made afresh = `encoder_dir`'s files (linked) + `head_source`'s mlm_head.safetensors."""
    from headstore.featurize.tuning.mlm_head import HEAD_FILE

    if folder.exists():  # whatever a killed run left: links of this key's encoder and head, made again
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for f in encoder_dir.iterdir():
        if f.is_file() and f.name != HEAD_FILE:
            os.symlink(f.resolve(), folder / f.name)
    os.symlink((head_source / HEAD_FILE).resolve(), folder / HEAD_FILE)
    return folder


def mlm_settings(cfg) -> dict:
    """What an MLM loss depends on besides the model: the texts (which, how many, which split) and how they
    are cut and masked."""
    return {"text": contents(cfg.mlm_text or None, "[data] mlm_text"), "text_split": cfg.mlm_text_split,
            "min_chars": GENERAL_MIN_CHARS, "max_texts": cfg.mlm_max_texts,
            "in_domain": content_digest(cfg.in_domain, DATA), "holdout": cfg.mlm_holdout_fraction,
            "max_length": cfg.adapt.max_length, **MLM_MASKS}


def mlm_losses(cfg, steps, built: dict, probe: Path) -> dict:
    """{(encoder, encoder seed): {"general": loss, "in_domain": loss, "head": ...}} on the same texts and
    masks; the base encoder once. Each step's key: mlm_settings and the keys of the steps that made the
    encoder and the probe."""
    from headstore.featurize.tuning.mlm_eval import mlm_loss

    sets = {"general": _general_texts(cfg), "in_domain": _in_domain_held_out(cfg)}
    probe_key = steps.key_of(probe)
    models = {("base", None): None}
    for enc, per_seed in built.items():
        for b in per_seed.values():
            if enc != "base":
                models[enc, b.seed] = b.model_dir
    results = {}
    for (enc, seed), model_dir in models.items():
        name = "mlm-base" if enc == "base" else f"mlm-{enc}-s{seed}"
        own_head = enc == "adapted"
        head = "its own (adapted from the probe's)" if own_head else "probe (frozen base)"

        def go(folder, model_dir=model_dir, own_head=own_head):
            scored = probe if model_dir is None else model_dir if own_head else \
                with_head(model_dir, probe, folder / "model")
            return {n: mlm_loss(str(scored), texts, max_length=cfg.adapt.max_length, device=mlm_loss_device(cfg),
                                **MLM_MASKS)["mlm_loss"] for n, texts in sets.items() if texts}

        encoder_key = None if model_dir is None else steps.key_of(model_dir)
        assert model_dir is None or encoder_key is not None, f"{model_dir}: made by no step of this run"
        settings = {"encoder": encoder_key, "probe": probe_key, "own_head": own_head, "texts": mlm_settings(cfg),
                    **device_key(cfg)}
        _, res = steps.run(name, settings, go, "mlm-loss")
        results[enc, seed] = {**res, "head": head}
    return results
