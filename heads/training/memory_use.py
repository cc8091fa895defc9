"""The document memory in train-head and eval (docs/memory.md): fitted after the head, kept where dev says so,
saved in the head folder, applied again by `cli eval` on the store and dataset it knows.

`--memory` (train-head): "auto" (the default: on for an IR dataset with training judgements, kept only where its
dev strength is above 0), "on" (asked for: a dataset with no training judgements is an error), "off".
"""
from __future__ import annotations

import numpy as np

from headstore.heads.artefacts.memory import MEMORY_FILE, DocumentMemory, PlacedMemory, judgements_digest
from headstore.heads.evaluation.evaluate import embedder
from headstore.heads.kinds import kind_of
from headstore.heads.kinds.ranking import IRSplit
from headstore.heads.kinds.seen import judged_documents, seen_mask
from headstore.heads.training.memory_fit import check_queries_apart, fit_memory

MEMORY_SETTINGS = ("auto", "on", "off")
# where the memory may act, both fitted and dev choosing (docs/memory.md: on SciFact the two are within 0.01 on dev,
# before the head ahead at every approach's mean but one)
SPACES = ("features", "outputs")


def wanted(task, setting: str) -> bool:
    """Whether train-head fits a memory: never with "off"; "auto" where the task has IR training judgements; "on"
    there, else one clear line (a memory asked for on a dataset with no training judgements). A training query
    that is also a judged document is refused here, before any training."""
    if setting not in MEMORY_SETTINGS:
        raise ValueError(f"--memory {setting!r}; valid: {list(MEMORY_SETTINGS)}")
    has = task.kind == "ir" and task.train is not None and len(task.train) > 0
    if setting == "on" and not has:
        raise ValueError(f"--memory: {task.name} has no training judgements of documents (a {task.kind} dataset); "
                         "a document memory needs IR judgements (qrels/train.tsv or positive pairs): drop --memory")
    if setting == "off" or not has:
        return False
    check_queries_apart(task, np.asarray(task.train.anchor), np.unique(task.train.positive))  # before any work
    return True


def text_ids_of(store, rows) -> list[str]:
    """The store text ids (row ids) of store rows."""
    return store.texts["text_id"].gather(np.asarray(rows, dtype=np.int64)).to_list()


def _doc_ids(raw_task, rows) -> list[str]:
    """The dataset's document ids of store rows (the first IR split's corpus; the text id where it has none)."""
    split = next((s for s in raw_task.eval_sets.values() if isinstance(s, IRSplit)), None)
    of = {} if split is None else dict(zip(np.asarray(split.doc_rows).tolist(), split.doc_ids))
    return [of.get(int(r), "") for r in rows]


def _rows_of_positions(raw_task, task) -> dict[int, int]:
    """{matrix position: store row} of the training pairs and the dev split (task is raw_task remapped)."""
    out: dict[int, int] = {}
    pairs = [(task.train.anchor, raw_task.train.anchor), (task.train.positive, raw_task.train.positive)]
    if "dev" in task.eval_sets and isinstance(task.eval_sets["dev"], IRSplit):
        dev, raw = task.eval_sets["dev"], raw_task.eval_sets["dev"]
        pairs += [(dev.query_rows, raw.query_rows), (dev.doc_rows, raw.doc_rows)]
    for pos, rows in pairs:
        out.update(zip(np.asarray(pos).tolist(), np.asarray(rows).tolist()))
    return out


def fit_for_head(store, raw_task, task, features, model, energy: str, negatives, precision: str,
                 spaces: tuple[str, ...] = SPACES):
    """(DocumentMemory or None where dev chose no edit, the same on the task's matrix, the fit's report, the memory
    fitted on train alone on the task's matrix (dev held out: for choices made on dev after it)): the memory
    of a head just trained, before it or after it as dev says (each fitted in seconds; ties to the first space);
    raw_task holds store rows, task the same task on `features`' positions (the head's inputs); `energy`,
    `negatives` (NegativesConfig: dev on candidates above exact_max) and `precision`: the head's resolved settings."""
    fits = [fit_memory(task, features, model, None, energy, space, negatives=negatives, precision=precision)
            for space in spaces]
    fitted = max(fits, key=lambda f: max(score for _, score in f.curve))  # the first of equals
    space = fitted.space
    report = {**fitted.describe(), "spaces": {f.space: {"move": f.move, "gamma": f.gamma,
                                                        "dev": max(score for _, score in f.curve)} for f in fits},
              "space_rule": "the space whose memory scores the best dev nDCG@10 (fitted on train)"}
    if fitted.gamma == 0:
        return None, None, {**report, "kept": False, "why": "dev chose strength 0 (the memory helps no dev query)"}, None
    to_row = _rows_of_positions(raw_task, task)
    rows = [to_row[int(p)] for p in fitted.positions]
    q_ids = text_ids_of(store, [to_row[int(p)] for p in fitted.pairs[0]])
    d_ids = text_ids_of(store, [to_row[int(p)] for p in fitted.pairs[1]])
    memory = DocumentMemory(tuple(text_ids_of(store, rows)), tuple(_doc_ids(raw_task, rows)), fitted.vectors.cpu(),
                            space, fitted.move, fitted.gamma, task.name, store.fingerprint,
                            judgements_digest(list(zip(q_ids, d_ids))))
    placed = PlacedMemory(np.asarray(fitted.positions), fitted.vectors, space)
    held_out = PlacedMemory(np.asarray(fitted.held_out[0]), fitted.held_out[1], space)
    return memory, placed, {**report, "kept": True, "file": MEMORY_FILE}, held_out


def load_for_eval(head_dir: str, store, raw_task, tf, setting: str) -> tuple[PlacedMemory | None, dict | None]:
    """`cli eval`: the head folder's memory checked against the store and the dataset, on the task's matrix
    (None: no memory, or --no-memory). Another store, or a changed document, is one clear line."""
    from pathlib import Path

    path = Path(head_dir) / MEMORY_FILE
    if setting == "off" or not path.is_file():
        if setting == "on":
            raise ValueError(f"--memory: {head_dir} has no {MEMORY_FILE} (train-head kept none: see its "
                             "metrics.json \"memory\"); drop --memory")
        return None, None
    memory = DocumentMemory.load(path)
    memory.check_store(store.fingerprint, str(path))
    for split in (s for s in raw_task.eval_sets.values() if isinstance(s, IRSplit)):
        memory.check_documents(raw_task.name, split.doc_ids, text_ids_of(store, split.doc_rows), str(path))
    rows = np.asarray(store.find_rows(list(memory.text_ids)), dtype=np.int64)
    inside = np.isin(rows, tf.rows) if tf.rows is not None else rows >= 0
    keep = np.flatnonzero(inside)
    placed = PlacedMemory(tf.positions(rows[keep]) if len(keep) else np.zeros(0, np.int64), memory.vectors[keep],
                          memory.space)
    return placed, {**memory.describe(), "documents_here": int(len(keep))}


def seen_report(task, split: str, items: dict, judged_positions) -> dict:
    """{part: {system: mean nDCG@10}, "counts"} of per-query values items[system] on task's IR `split`, split into
    the queries on documents the training judged (seen: judged_positions, the memory's documents) and the others;
    a split all seen is said."""
    return mask_report(seen_mask(task.eval_sets[split], judged_documents(judged_positions)), split, items)


def mask_report(mask: np.ndarray, split: str, items: dict) -> dict:
    """seen_report's figures from a seen mask (Q,) aligned with the per-query values."""
    out = {"counts": {"seen": int(mask.sum()), "unseen": int((~mask).sum()), "all": int(len(mask))}}
    for part, m in (("seen", mask), ("unseen", ~mask), ("all", np.ones_like(mask))):
        out[part] = {k: float(np.mean(np.asarray(v)[m])) if m.any() else None for k, v in items.items()}
    if len(mask) and mask.all():
        out["warning"] = (f"every {split} query is seen: the training judgements cover a relevant document of each, "
                          "so these figures say nothing of new documents")
    return out


def memory_items(task, split: str, features, model, norm, placed: PlacedMemory, energy: str) -> np.ndarray:
    """Per-query nDCG@10 of the head (model None: frozen features) with the memory on `split`."""
    kind = kind_of(task)
    _, items = kind.evaluate_splits(task, (split,), embedder(model, features, norm, placed), (energy,))[split]
    return next(iter(items[0].values()))


def memory_block(task, features, model, norm, placed: PlacedMemory, energy: str, items: dict, fit: dict) -> dict:
    """metrics.json "memory": the fit, and on dev and test the head + memory against the head and the frozen
    features (paired bootstrap 95% CIs over queries), each split into seen and unseen queries."""
    from headstore.heads.scoring.bootstrap import two_level_ci

    block: dict = {"fit": fit}
    for split, per in items.items():
        if split == "dev" and fit.get("judgements") == "train+dev":
            continue  # the memory was fitted on dev's judgements too: no held-out figure there (the fit's dev curve is)
        with_memory = memory_items(task, split, features, model, norm, placed, energy)
        head, frozen = np.asarray(per["head"]), np.asarray(per["baseline"])
        ci = (lambda a, b: list(two_level_ci(a, minus=b)) if len(a) > 1 else None)
        block[split] = {"head+memory": float(with_memory.mean()), "head": float(head.mean()),
                        "frozen": float(frozen.mean()),
                        "minus_head": float(with_memory.mean() - head.mean()), "ci_minus_head": ci(with_memory, head),
                        "minus_frozen": float(with_memory.mean() - frozen.mean()),
                        "ci_minus_frozen": ci(with_memory, frozen),
                        "parts": seen_report(task, split, {"frozen": frozen, "head": head,
                                                           "head+memory": with_memory}, placed.positions)}
    return block


def memory_line(block: dict) -> str:
    """The terminal's line on the memory: what was kept, and head + memory on the reported split by part."""
    fit = block.get("fit", {})
    if not fit.get("kept", True):
        return f"memory: none kept ({fit.get('why', 'dev chose no edit')}; metrics.json \"memory\")"
    if block.get("note"):
        return f"memory: {block['note']}"
    split = "test" if "test" in block else next((k for k in block if k != "fit"), None)
    where = {"features": "before the head", "outputs": "after the head"}.get(fit.get("space"), fit.get("space"))
    head = f"memory: {fit.get('documents')} documents, {fit.get('move')} {where}, strength {fit.get('gamma'):.3g}"
    if split is None:
        return head
    b, parts = block[split], block[split]["parts"]
    ci = b.get("ci_minus_head") or [float("nan")] * 2
    shares = "; ".join(f"{p} ({parts['counts'][p]}): {parts[p]['head+memory']:.4f} vs head {parts[p]['head']:.4f}"
                       for p in ("seen", "unseen") if parts["counts"][p])
    return (f"{head}\n  {split} nDCG@10 head + memory {b['head+memory']:.4f} vs head {b['head']:.4f} "
            f"({b['minus_head']:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}]), frozen {b['frozen']:.4f}; {shares}"
            + (f"\n  note: {parts['warning']}" if parts.get("warning") else ""))


def eval_memory(task, features, model, norm, placed: PlacedMemory, energy: str, split: str, per_item: dict,
                info: dict) -> dict:
    """{"memory": ...} of `cli eval`'s metrics.json: head + memory on the scored split, or why it changes nothing
    here; {} without a memory (info None)."""
    if info is None:
        return {}
    fit = {**info, "kept": True}
    if not len(placed) or not isinstance(task.eval_sets.get(split), IRSplit):
        return {"memory": {"fit": fit, "note": f"none of the memory's {info['documents']} documents is in "
                                               f"{task.name}: the figures are the head's alone"}}
    return {"memory": memory_block(task, features, model, norm, placed, energy, {split: per_item[split]}, fit)}
