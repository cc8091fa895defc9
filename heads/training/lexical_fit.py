"""The lexical channel in train-head and eval (heads.scoring.lexical, docs/memory.md "Lexical fusion"): BM25 over the
corpus's texts fused with the head's scores (and its document memory), the weight chosen on dev, saved as
lexical.json in the head folder and applied again by `cli eval` to any IR dataset.

Dev chooses two numbers together, each with "none" as a candidate so that a channel dev says nothing for changes
nothing: BM25's weight w (0 = the dense ranking) and the memory's gain (its change of the dense score scaled: 1 = as
fitted, 0 = no memory). A gain above 1 lets a document the memory knows keep its place against what BM25 brings
up. The memory scored on dev is the one fitted on train alone (dev's judgements are in the saved one). Of the
candidates within one paired standard error of the best dev nDCG@10, dev takes the least weight, then gain 1 (`one_se`).
`--lexical`: "auto" (the default: on for IR data whose splits have their texts, where bm25s is installed, kept where
dev's w > 0), "on" (required: an error where it cannot be), "off".
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from headstore.data.files import atomic_write_json
from headstore.heads.evaluation.evaluate import embedder
from headstore.heads.kinds.fused_rank import dense_scores, fused_metrics, lexical_scores, split_texts
from headstore.heads.kinds.ranking import IRSplit
from headstore.heads.kinds.seen import judged_documents, scored_seen_mask
from headstore.heads.scoring.lexical import LEXICAL, LEXICAL_VERSION, Bm25Config, fused, gained, per_query_scaled

LEXICAL_FILE = "lexical.json"
NUMBERS = ("weight", "weight_new", "gain", "frozen_weight")  # lexical.json's numbers, each >= 0
LEXICAL_SETTINGS = ("auto", "on", "off")
WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)  # BM25 per unit of dense score (the one-SE rule: the least)
GAINS = (1.0, 1.5, 2.0, 3.0, 0.0)  # the memory's change of score scaled (1 first: the one-SE rule's order)
AUTO_MAX_DOCS = 200_000  # "auto" fits the channel up to this corpus size: dev's dense and BM25 scores are held
# whole (queries x documents floats, a few hundred MB there); above it only --lexical asks for it


def without_texts(task):
    """`task` with its IR splits' texts dropped: they serve the lexical channel only, and a run without it need not
    hold them (a 1M-document corpus's texts by id are ~0.13 GB, held from the data's reading to the run's end)."""
    sets = {name: replace(s, texts=None) if isinstance(s, IRSplit) else s for name, s in task.eval_sets.items()}
    return replace(task, eval_sets=sets)


def wanted(task, setting: str) -> bool:
    """Whether train-head fits the channel: "off" never; "auto" on IR data whose splits carry their texts, with
    bm25s installed; "on" there, else one clear line."""
    if setting not in LEXICAL_SETTINGS:
        raise ValueError(f"--lexical {setting!r}; valid: {list(LEXICAL_SETTINGS)}")
    splits = [s for s in task.eval_sets.values() if isinstance(s, IRSplit)]
    why = None
    if task.kind != "ir" or "dev" not in task.eval_sets or not splits:
        why = f"{task.name} is no IR dataset with a dev split (a {task.kind} dataset)"
    elif any(s.texts is None for s in splits):
        why = f"{task.name}'s corpus holds texts that are not the dataset's own (--unlabeled)"
    elif not _has_bm25s():
        why = "bm25s or PyStemmer is not installed (pip install 'headstore[lexical]')"
    if why and setting == "on":
        raise ValueError(f"--lexical: {why}; drop --lexical")
    large = why is None and max(len(s.doc_ids) for s in splits) > AUTO_MAX_DOCS
    return setting == "on" or (setting == "auto" and why is None and not large)


def _has_bm25s() -> bool:
    try:
        import bm25s  # noqa: F401  (an optional extra)
        import Stemmer  # noqa: F401  (PyStemmer, in the same extra)
    except ImportError:
        return False
    return True


def gained_dense(split: IRSplit, features, model, norm, placed, energy: str):
    """gain -> (Q, N) dense scores with the memory's change of score scaled by gain: s0 + gain (s1 - s0), s0 without
    the memory, s1 with it (gain 1: the memory as fitted; 0: none). Linear in the score, so the same in either
    space the memory acts in and for any energy; only the documents the memory holds change."""
    plain = split_dense(split, features, model, norm, None, energy)
    if placed is None or not len(placed):
        return lambda gain: plain
    edited = split_dense(split, features, model, norm, placed, energy)  # (Q, N), plain off the memory's columns
    return lambda gain: gained(plain, edited, gain)


def split_dense(split: IRSplit, features, model, norm, placed, energy: str):
    """(Q, N) dense scores of the head (model None: the frozen features) with a memory on a split."""
    embed = embedder(model, features, norm, placed)
    return dense_scores(embed(split.query_rows, "query")[0], embed(split.doc_rows, "document")[0], energy)


def choose(split: IRSplit, lexical, dense_of, gains, queries=None) -> tuple[float, float, float, list]:
    """(gain, weight, dev nDCG@10, the grid [[gain, weight, score, within one SE]]) by the one-standard-error rule
    (`one_se`): of the candidates within one paired standard error of dev's best, the least BM25 weight, then the
    gain first in `gains` (1: the memory as fitted). `queries`: a mask of the scored queries that count (all)."""
    grid, per_query, scaled_lexical = [], [], per_query_scaled(lexical)  # each spread once, not once a weight
    for gain in gains:
        dense = dense_of(gain)
        scaled = per_query_scaled(dense)
        for w in WEIGHTS:
            score = dense if w == 0 else scaled + w * scaled_lexical  # = heads.scoring.lexical.fused
            values = fused_metrics(split, lambda s, e, score=score: score[s:e], "cosine")[1]
            per_query.append(values if queries is None else values[queries])
            grid.append([gain, w, float(per_query[-1].mean())])
    near = one_se(per_query)
    for row, ok in zip(grid, near):
        row.append(bool(ok))
    pick = min((i for i in range(len(grid)) if near[i]), key=lambda i: (grid[i][1], gains.index(grid[i][0])))
    return grid[pick][0], grid[pick][1], grid[pick][2], grid


def one_se(per_query: list) -> np.ndarray:
    """(C,) which candidates' dev mean is within one standard error of the best's, the error paired over queries
    (the spread of the per-query differences / sqrt(queries)). Dev sets are small (SciFact: 81 claims): the rule
    takes the simplest candidate dev cannot tell from the best, not the best by noise (docs/memory.md)."""
    values = np.stack([np.asarray(v, dtype=np.float64) for v in per_query])  # (C, Q)
    best = values[int(values.mean(axis=1).argmax())]
    gap = best - values  # (C, Q)
    se = gap.std(axis=1, ddof=1) / np.sqrt(values.shape[1]) if values.shape[1] > 1 else np.zeros(len(values))
    return gap.mean(axis=1) <= se + 1e-12


def fit_lexical(task, features, model, norm, energy: str, held_out, cfg: Bm25Config | None = None) -> dict:
    """The channel's fit on dev: BM25's weight and the memory's gain (held_out: the memory fitted on train alone)
    for the head, and BM25's weight for the frozen features beside it (the fair baseline: same channel, no head)."""
    t0, cfg = time.perf_counter(), cfg or Bm25Config()
    dev = task.eval_sets["dev"]
    lexical = lexical_scores(dev, cfg, task.name)
    gains = GAINS if held_out is not None and len(held_out) else (1.0,)
    dense_of = gained_dense(dev, features, model, norm, held_out, energy)
    gain, weight, score, grid = choose(dev, lexical, dense_of, gains)
    frozen_w = choose(dev, lexical, lambda g: split_dense(dev, features, None, norm, None, "cosine"), (1.0,))[1]
    new = new_corpus_weight(task, lexical, dense_of(0.0), weight, held_out is not None and len(held_out) > 0)
    return {"config": cfg.to_dict(), "weight": weight, "gain": gain, "dev": score, **new,
            "dev_without": grid[0][2], "dev_grid": grid, "frozen_weight": frozen_w, "kept": weight > 0,
            "seconds": round(time.perf_counter() - t0, 3), "dataset": task.name, "version": LEXICAL_VERSION,
            "rule": "one standard error: of BM25's weights and the memory's gains (the memory fitted on train "
                    "alone) within one paired standard error of the best dev nDCG@10, the least weight, then the "
                    f"gain first in {list(gains)}"}


def new_corpus_weight(task, lexical, plain, weight: float, memory: bool) -> dict:
    """{"weight_new", ...}: BM25's weight for a corpus the memory holds no document of (another dataset: every query
    unseen), by the one-SE rule on the dev queries none of whose relevant documents the training (train alone)
    judged, ranked by the head without the memory (`plain`, (Q, N) dense scores). On the memory's own corpus the
    seen queries pull BM25's weight down (the memory already ranks their documents); a new corpus has none. A head
    without a memory, or a dev with no such query, uses `weight` everywhere (said)."""
    dev = task.eval_sets["dev"]
    judged = judged_documents(np.unique(np.asarray(task.train.positive)))
    unseen = ~np.asarray(scored_seen_mask(dev, judged), dtype=bool)  # aligned with the per-query values
    if not memory or not unseen.any():
        why = "no document memory" if not memory else "no dev query is unseen"
        return {"weight_new": weight, "dev_new_queries": int(unseen.sum()), "weight_new_why": f"{why}: = weight"}
    _, weight_new, score, _ = choose(dev, lexical, lambda gain: plain, (1.0,), queries=unseen)
    return {"weight_new": weight_new, "dev_new": score, "dev_new_queries": int(unseen.sum())}


def applied_weight(fit: dict, judged: int | None) -> float:
    """The weight for a corpus holding `judged` of the documents the head's training judged: `weight`
    where it holds any (a corpus like the one dev chose it on) or the count is not known (None), `weight_new` where
    none (a new corpus); a head without a memory has weight_new = weight."""
    return fit.get("weight_new", fit["weight"]) if judged == 0 else fit["weight"]


def write_lexical(out, task, features, model, energy: str, items: dict, placed, held_out, dim: int,
                  seen: dict) -> dict:
    """{"lexical": ...}: the channel fitted on dev for the head just trained (features: its inputs; placed /
    held_out: its memory as saved / fitted on train alone, None without one), saved in `out` where dev kept it."""
    fit = fit_lexical(task, features, model, None, energy, held_out)
    if not fit["kept"]:
        return {"lexical": {"fit": {**fit, "why": "dev chose weight 0 (BM25 helps no dev query)"}}}
    save(out, fit)
    return {"lexical": lexical_block(task, features, model, None, placed, energy, items, fit, features[:, :dim],
                                     seen, judged=None)}  # the training's own corpus: `weight`


def eval_lexical(task, features, model, norm, placed, energy: str, split: str, per_item: dict, saved: dict | None,
                 dim: int, seen: dict, setting: str, judged: int | None = None) -> dict:
    """{"lexical": ...} of `cli eval`'s metrics.json: the channel at the head's saved weight on the scored split
    (`applied_weight` of `judged`, the corpus's documents the training judged), or why it is not applied here; {}
    without one (saved None)."""
    if saved is None:
        return {}
    data = task.eval_sets.get(split)
    why = ("not an IR dataset" if not isinstance(data, IRSplit) else
           "its corpus holds texts that are not the dataset's own (--unlabeled)" if data.texts is None else None)
    fit = {k: v for k, v in saved.items() if k != "bm25"}
    if why:
        if setting == "on":
            raise ValueError(f"--lexical: {task.name}: {why}; drop --lexical")
        return {"lexical": {"fit": {**fit, "kept": True}, "note": f"{task.name}: {why}: the dense figures"}}
    return {"lexical": lexical_block(task, features, model, norm, placed, energy, {split: per_item[split]},
                                     {**fit, "kept": True}, features[:, :dim], seen, judged)}


def save(out: Path, fit: dict) -> None:
    atomic_write_json(Path(out) / LEXICAL_FILE, {k: fit[k] for k in (*NUMBERS, "config", "dataset", "version", "dev",
                                                                      "dev_without")}, sort_keys=True)


def load(head_dir: str, setting: str, fix: str = "retrain the head or use --no-lexical") -> dict | None:
    """lexical.json of a head folder (or an index's lexical/; None: none, or --no-lexical); a file of another
    version, cut short or with a bad value is one clear line ending in `fix`."""
    path = Path(head_dir) / LEXICAL_FILE
    if setting == "off" or not path.is_file():
        if setting == "on":
            raise ValueError(f"--lexical: {head_dir} has no {LEXICAL_FILE} (train-head kept none: see its "
                             "metrics.json \"lexical\"); drop --lexical")
        return None
    try:
        saved = json.loads(path.read_text())
        version = saved.get("version")
        if version == LEXICAL_VERSION:
            cfg = LEXICAL[saved["config"]["kind"]][0](**{k: v for k, v in saved["config"].items()
                                                         if k not in ("kind", "version")})
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a lexical channel's settings ({type(e).__name__}: {e}); {fix}") from None
    if version != LEXICAL_VERSION:
        raise ValueError(f"{path}: lexical version {version}, this headstore scores version {LEXICAL_VERSION}; {fix}")
    bad = [k for k in NUMBERS if not isinstance(saved.get(k), (int, float))
           or isinstance(saved.get(k), bool) or not 0 <= saved[k] < float("inf")]
    if bad:
        raise ValueError(f"{path}: {', '.join(bad)} must be numbers >= 0 (got {[saved.get(k) for k in bad]}); {fix}")
    return {**saved, "bm25": cfg}


def split_index(task, split: str, cfg):
    """The lexical index of `split`'s corpus (`cfg`: its Bm25Config), built once for every run scored on it."""
    return LEXICAL[cfg.to_dict()["kind"]][1](split_texts(task.eval_sets[split], task.name)[1], cfg)


def split_items(task, split: str, features, model, norm, placed, energy: str, runs: dict, cfg,
                index=None) -> dict[str, np.ndarray]:
    """{name: per-query nDCG@10 on `split`} of the head (model None: frozen) for each run {name: (weight, gain)}:
    the memory at `gain`, BM25 at `weight`; the split embedded once and its BM25 index (`index`, else built here
    where a run needs it) shared by the runs; a block of queries at a time (never a queries x corpus matrix whole)."""
    data = task.eval_sets[split]
    embed = embedder(model, features, norm)
    zq, zd = embed(data.query_rows, "query")[0], embed(data.doc_rows, "document")[0]  # (Q, d), (N, d)
    edited = (embedder(model, features, norm, placed)(data.doc_rows, "document")[0]
              if placed is not None and len(placed) and any(g for _, g in runs.values()) else None)  # (N, d)
    lexical = any(w for w, _ in runs.values())
    query_texts = split_texts(data, task.name)[0] if lexical else None
    index = index if index is not None or not lexical else split_index(task, split, cfg)

    def scores_of(weight: float, gain: float):
        def scores(start: int, stop: int):
            plain = dense_scores(zq[start:stop], zd, energy)  # (q, N)
            dense = plain if edited is None or not gain else gained(
                plain, dense_scores(zq[start:stop], edited, energy), gain)
            return fused(dense, index.scores(query_texts[start:stop]) if weight else dense, weight)
        return scores

    return {name: fused_metrics(data, scores_of(w, g), energy)[1] for name, (w, g) in runs.items()}


def lexical_block(task, features, model, norm, placed, energy: str, items: dict, fit: dict, frozen_features,
                  seen: dict, judged: int | None) -> dict:
    """metrics.json "lexical": the fit, and on each held-out split the head (+ memory) + BM25 against the head
    (+ memory) without it, the frozen features, and the frozen features + BM25 at their own dev weight (paired
    bootstrap 95% CIs over queries), each split into seen and unseen queries (`seen`: {split: mask}, aligned with
    the per-query values; a split without one is reported whole)."""
    from headstore.heads.scoring.bootstrap import two_level_ci
    from headstore.heads.training.memory_use import mask_report

    cfg = Bm25Config(**{k: v for k, v in fit["config"].items() if k not in ("kind", "version")})
    block: dict = {"fit": fit}
    for split, per in items.items():
        if split == "dev":
            continue  # dev chose the weight: no held-out figure there (the fit's dev grid is)
        weight, index = applied_weight(fit, judged), split_index(task, split, cfg)
        head = split_items(task, split, features, model, norm, placed, energy,
                           {"fused": (weight, fit["gain"]), "dense": (0.0, 1.0)}, cfg, index)
        with_lexical, dense = head["fused"], head["dense"]
        frozen = np.asarray(per["baseline"])
        frozen_lex = split_items(task, split, frozen_features, None, None, None, "cosine",
                                 {"frozen+lexical": (fit["frozen_weight"], 1.0)}, cfg, index)["frozen+lexical"]
        ci = (lambda a, b: list(two_level_ci(a, minus=b)) if len(a) > 1 else None)
        block[split] = {"weight": weight, "judged_documents": judged, "fused": float(with_lexical.mean()),
                        "dense": float(dense.mean()),
                        "frozen": float(frozen.mean()), "frozen+lexical": float(frozen_lex.mean()),
                        "minus_dense": float(with_lexical.mean() - dense.mean()), "ci_minus_dense": ci(with_lexical, dense),
                        "minus_frozen": float(with_lexical.mean() - frozen.mean()),
                        "ci_minus_frozen": ci(with_lexical, frozen),
                        "minus_frozen_lexical": float(with_lexical.mean() - frozen_lex.mean()),
                        "ci_minus_frozen_lexical": ci(with_lexical, frozen_lex),
                        "parts": mask_report(np.asarray(seen[split], dtype=bool) if split in seen else
                                             np.zeros(len(frozen), dtype=bool), split,
                                             {"frozen": frozen, "frozen+lexical": frozen_lex, "dense": dense,
                                              "fused": with_lexical})}
        if split not in seen:
            block[split]["parts"]["note"] = "not split: the head keeps no record of its judged documents"
    return block


def lexical_line(block: dict) -> str:
    """The terminal's line on the lexical channel."""
    fit = block.get("fit", {})
    if not fit.get("kept"):
        return f"lexical: none kept ({fit.get('why', 'dev chose weight 0')}; metrics.json \"lexical\")"
    new = fit.get("weight_new", fit["weight"])
    head = (f"lexical: BM25 weight {fit['weight']:g} ({new:g} on a corpus none of whose "
            f"documents the training judged), memory gain {fit['gain']:g} (chosen on {fit.get('dataset')}'s dev: "
            f"{fit.get('dev', float('nan')):.4f} vs {fit.get('dev_without', float('nan')):.4f} without BM25)")
    if block.get("note"):
        return f"{head}\n  {block['note']}"
    split = "test" if "test" in block else next((k for k in block if k not in ("fit", "note")), None)
    if split is None:
        return head
    b, parts = block[split], block[split]["parts"]
    ci = b.get("ci_minus_dense") or [float("nan")] * 2
    shares = "; ".join(f"{p} ({parts['counts'][p]}): {parts[p]['fused']:.4f} vs {parts[p]['dense']:.4f}, frozen "
                       f"{parts[p]['frozen']:.4f}" for p in ("seen", "unseen") if parts["counts"][p])
    return (f"{head}\n  {split} nDCG@10 with BM25 (weight {b.get('weight', fit['weight']):g}) {b['fused']:.4f} "
            f"vs without {b['dense']:.4f} "
            f"({b['minus_dense']:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}]), frozen {b['frozen']:.4f}, frozen + BM25 "
            f"{b['frozen+lexical']:.4f}; {shares}")
