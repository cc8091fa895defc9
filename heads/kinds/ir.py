"""The IR kind: each query of a split ranks the whole corpus (IR metrics, nDCG@10 primary).

Built from a BEIR folder (corpus, queries, qrels per split), or from a table of positive pairs scored as
retrieval (heads.kinds.pairs: each anchor ranks all positives of its split). Trains on the relevant
(query, document) pairs; hard negatives are mined from `Task.corpus_rows`. Rankings, per-epoch selection
and TREC run files follow one rule (heads.kinds.ranking).
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import polars as pl
import torch

from headstore.data.text_id import doc_text, text_id
from headstore.heads.kinds.base import PREFIX, PairSet, Task, TaskKind, carve_dev, store_rows
from headstore.heads.kinds.ranking import (IR_TOPK, IRSplit, RunningTopK, candidate_split, doc_blocks, ir_metrics_of,
                                           ranked_lists, run_lines, selection_ndcg, trec_lines, write_trec_run)
from headstore.heads.kinds.seen import relevant_pairs, scored_seen_mask
from headstore.heads.scoring.ir_metrics import trec_tie_order

EVALUATION = "retrieval: each query ranks the whole corpus (IR metrics, nDCG@10)"


# the anchor on the unlabeled store (heads.training.anchor) train-head uses for IR data unless --anchor-weight is given:
# the SciFact study's frontier point (docs/robust.md, 3 seeds: +0.12 nDCG@10 over frozen cosine in domain,
# Cranfield -0.008 and CACM -0.013 against -0.019 and -0.049 for the round-2 default; lambda 1 keeps +0.14 in
# domain at -0.010 / -0.022, lambda 3 meets both out-of-domain goals at +0.10 in domain)
ANCHOR_IR = 2.0
# what the guard suggests when a head loses on dev: (setting, value, option), each only where the head had another
# value: a shallower head, a looser energy bound, a lower lr, a stronger anchor, another loss (docs/l1-energy.md)
TRIES = (("depth", 1, "--depth 1"), ("q", 12.0, "--q 12"), ("lr", 1e-3, "--lr 1e-3"),
         ("anchor_weight", 3.0, "--anchor-weight 3"), ("loss", "mnr", "--loss mnr"))


class IRKind(TaskKind):
    name = "ir"
    form = "positives"
    items_name = "queries"
    defaults = {"depth": 2, "lr": 3e-3, "epochs": 15, "anchor_weight": ANCHOR_IR}  # the dataclass defaults
    # (the SciFact study's, docs/l1-energy.md) and the anchor of docs/robust.md
    data_words = "IR and positive-pairs"
    defaults_why = "the SciFact studies' choice: docs/l1-energy.md round 2, the anchor docs/robust.md"
    suggestion = "--depth 1, --q 12, --lr 1e-3, --anchor-weight 3 or --loss mnr"  # (suggest: those not in use)
    metric_names = tuple(f"{{p}}_{n}@{k}" for n in ("ndcg", "mrr", "recall") for k in (1, 10, 100)) + ("{p}_map@100",)

    def primary_metric(self, energy: str) -> str:
        return f"{PREFIX[energy]}_ndcg@10"

    def suggest(self, task, head_cfg, cfg) -> str:
        """Settings to change, each left out where the head already had it (TRIES), and first, for positive
        pairs scored alone, the unlabeled texts they will be searched against (`--unlabeled`)."""
        values = {**asdict(head_cfg), **cfg.to_dict()}
        tries = [flag for key, value, flag in TRIES if values.get(key) != value]
        splits = [d for d in task.eval_sets.values() if isinstance(d, IRSplit)]
        if task.unlabeled is None and splits and all(d.exclude_self for d in splits):  # positive pairs alone
            n = max(len(d.doc_ids) for d in splits)  # no text of their own to anchor on (heads.training.anchor)
            tries = [f"{t} with it" if t.startswith("--anchor-weight") else t for t in tries]
            tries.insert(0, f"--unlabeled CORPUS (the texts the anchors will be searched against: each now ranks "
                            f"only the {n} positives of its split, an easier task than yours)")
        return ", ".join(tries[:-1]) + (" or " if len(tries) > 1 else "") + tries[-1] if tries else "other settings"

    def evaluate(self, task, split, embed, energies):
        return self.evaluate_splits(task, (split,), embed, energies)[split]

    def evaluate_splits(self, task, splits, embed, energies, rankings=None):
        """Every head's metrics under each energy on each split: queries embedded once, the corpus block by block
        (ranking.DOC_BLOCK documents at a time, every split, head and energy ranked on each block), so no (N, d)
        matrix of document outputs is ever held and splits of one corpus (dev and test) share one pass over it.
        `rankings`: filled with {split: [{energy: RunningTopK} per head]} (run files, candidate share)."""
        out = {}
        for group in _same_corpus([(s, task.eval_sets[s]) for s in splits]):
            tops = self._rank_together(dict(group), embed, energies)
            for split, data in group:
                out[split] = self._metrics(data, tops[split], energies)
            if rankings is not None:
                rankings.update(tops)
        return out

    def _rank_together(self, sets: dict, embed, energies) -> dict:
        """{split: [{energy: RunningTopK} per head, or None for a head whose outputs are not finite]}, the
        splits `sets` (one corpus) ranked in one pass over it."""
        first = next(iter(sets.values()))
        tie = trec_tie_order(first.doc_ids)
        zq = {s: embed(data.query_rows, "query") for s, data in sets.items()}  # (H, Q, d) each
        finite = {s: torch.isfinite(z).flatten(1).all(1) for s, z in zq.items()}  # (H,) each
        tops = {s: [{e: RunningTopK(zq[s][h], e, IR_TOPK + int(data.exclude_self), tie) for e in energies}
                    for h in range(zq[s].shape[0])] for s, data in sets.items()}
        for start, zd in doc_blocks(lambda a, b: embed(first.doc_rows[a:b], "document"), len(first.doc_ids)):
            ok = torch.isfinite(zd).flatten(1).all(1)
            for s in sets:
                finite[s] &= ok
                for h, per_energy in enumerate(tops[s]):
                    if finite[s][h]:
                        for top in per_energy.values():
                            top.add(zd[h], start)
        return {s: [t if finite[s][h] else None for h, t in enumerate(tops[s])] for s in sets}

    def _metrics(self, data: IRSplit, tops: list, energies) -> tuple[list[dict], list[dict]]:
        """(metrics per head, per-query nDCG@10 per head and energy) of finished rankings; NaN for a None head."""
        results, items = [], []
        for per_energy in tops:
            if per_energy is None:
                results.append(self.nan_metrics(energies))
                items.append({PREFIX[e]: np.full(len(data.query_ids), np.nan) for e in energies})
                continue
            m, it = {}, {}
            for energy, top in per_energy.items():
                mh, it[PREFIX[energy]] = ir_metrics_of(data, ranked_lists(data, top), energy)
                m.update(mh)
            results.append(m)
            items.append(it)
        return results, items

    def selection_scores(self, task, split, embed, energy, precision):
        data: IRSplit = task.eval_sets[split]
        zq, zd = embed(data.query_rows, "query").float(), embed(data.doc_rows, "document").float()  # (H, Q, d), (H, N, d)
        return selection_ndcg(data, zq, zd, energy, precision)

    def selection_set(self, task, split, X, negatives):
        """Above negatives.exact_max documents, the dev split cut to candidates (ranking.candidate_split), searched
        once: each epoch ranks those instead of the whole corpus."""
        data: IRSplit = task.eval_sets[split]
        if not negatives.on_candidates(len(data.doc_rows)):
            return data, {"method": "exact", "corpus": len(data.doc_rows)}
        chosen, keep = candidate_split(data, X, negatives.pool_k)
        return chosen, {"method": "candidates", "pool_k": negatives.pool_k, "n_candidates": len(keep),
                        "corpus": len(data.doc_rows), "exact_max": negatives.exact_max,
                        "made": "every dev query's exact frozen top pool_k (cosine) and every judged "
                                "document, re-scored by each head each epoch"}

    def selection_rows(self, task, split, negatives):
        """Above negatives.exact_max, the queries and at most every query's pool_k candidates and judged documents
        (they overlap: fewer), as selection_set makes them; the whole split otherwise."""
        data: IRSplit = task.eval_sets[split]
        if not negatives.on_candidates(len(data.doc_rows)):
            return len(self.rows(data))
        judged = sum(len(data.qrels.get(q, {})) for q in data.query_ids)
        return len(data.query_rows) + min(len(data.doc_rows), len(data.query_rows) * negatives.pool_k + judged)

    def candidate_share(self, task, split, chosen, rankings):
        """The share of the exact top-10 (over the whole corpus, in the head's space: the first head's ranking
        under the first energy that evaluate_splits kept) inside the candidates, on every query of the split."""
        data: IRSplit = task.eval_sets[split]
        if chosen is data or not rankings.get(split) or rankings[split][0] is None:
            return {}
        top = next(iter(rankings[split][0].values()))
        inside = set(chosen.doc_ids)
        hits = [data.doc_ids[j] in inside for row in ranked_lists(data, top, 10).values() for j in row]
        return {"top10_share": float(np.mean(hits)) if hits else float("nan"), "share_queries": len(data.query_ids)}

    def seen_mask(self, data: IRSplit, judged: frozenset[int]) -> np.ndarray:
        return scored_seen_mask(data, judged)

    def relevant_pairs(self, data: IRSplit) -> tuple[np.ndarray, np.ndarray]:
        return relevant_pairs(data)

    def n_items(self, data: IRSplit) -> int:
        return len(data.query_ids)

    def warnings(self, task, split):
        data: IRSplit = task.eval_sets[split]
        if any(g > 0 for q in data.query_ids for g in data.qrels.get(q, {}).values()):
            return []
        return [f"{task.name}: no {split} query has a relevant document (every judgement of its "
                f"{len(data.query_ids)} queries has grade <= 0), so every IR metric is 0, as trec_eval scores "
                "it; check the qrels' score column"]

    def write_runs(self, task, embed, energy, splits, out_dir, run_name, rankings=None):
        written = []
        for split in splits:
            data = task.eval_sets.get(split)
            if data is None:
                continue
            kept, name = (rankings or {}).get(split), run_name.replace(" ", "_")
            if kept and kept[0] is not None and energy in kept[0]:  # ranked already (evaluate_splits)
                lines = run_lines(data, *ranked_lists(data, kept[0][energy], with_energies=True), name)
            else:
                q = embed(data.query_rows, "query")[0]  # (Q, d); the corpus block by block:
                d = lambda a, b, rows=data.doc_rows: embed(rows[a:b], "document")[0]  # noqa: E731
                lines = trec_lines(data, q, d, energy, name)
            written.append(write_trec_run(Path(out_dir) / f"run.{split}.trec", lines))
        return written

    def rows(self, data: IRSplit) -> np.ndarray:
        return np.concatenate([data.query_rows, data.doc_rows])

    def item_rows(self, data: IRSplit) -> np.ndarray:
        return np.asarray(data.query_rows)

    def without(self, data: IRSplit, rows: np.ndarray):
        """Queries that use one of `rows` dropped (the corpus stays: it is what every split ranks)."""
        keep = ~np.isin(data.query_rows, rows)
        ids = [q for q, k in zip(data.query_ids, keep) if k]
        return IRSplit(ids, data.query_rows[keep], data.doc_ids, data.doc_rows, {q: data.qrels[q] for q in ids},
                       data.exclude_self, data.texts), int((~keep).sum())


KIND = IRKind()


def _same_corpus(sets: list[tuple[str, IRSplit]]) -> list[list[tuple[str, IRSplit]]]:
    """The splits grouped by the corpus they rank (dev and test of a BEIR folder: one group)."""
    groups: list[list[tuple[str, IRSplit]]] = []
    for split, data in sets:
        for group in groups:
            first = group[0][1]
            if first.doc_ids == data.doc_ids and np.array_equal(first.doc_rows, data.doc_rows):
                group.append((split, data))
                break
        else:
            groups.append([(split, data)])
    return groups


def _qrel_dict(frame: pl.DataFrame) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for q, d, s in frame.select("query_id", "corpus_id", "score").iter_rows():
        out.setdefault(q, {})[d] = int(s)
    return out


def from_beir(ds, store, for_eval: bool) -> Task:
    """A BEIR folder joined to the store: train pairs from qrels/train (dev carved by query text when the
    folder has no dev qrels), evaluation splits ranked against the whole corpus."""
    corpus, queries, qrels = ds.beir.corpus, ds.beir.queries, ds.beir.qrels
    doc_ids = corpus["_id"].to_list()
    docs = [doc_text(t, x) for t, x in zip(corpus["title"], corpus["text"])]
    doc_rows = store_rows(store, docs, f"{ds.path} corpus", "document")
    doc_row = dict(zip(doc_ids, doc_rows.tolist()))
    q_text = dict(zip(queries["_id"].to_list(), queries["text"].to_list()))
    texts = {"query": q_text, "document": dict(zip(doc_ids, docs))}

    def ir_split(qr: dict[str, dict[str, int]]) -> IRSplit:
        qids = sorted(qr)
        return IRSplit(qids, store_rows(store, [q_text[q] for q in qids], f"{ds.path} queries", "query"), doc_ids,
                       doc_rows, qr, texts=texts)

    eval_sets: dict[str, object] = {}
    train, dev_note, relevant = None, "", set()
    if "train" in qrels and not for_eval:
        tr = _qrel_dict(qrels["train"])
        if "dev" in qrels:
            eval_sets["dev"] = ir_split(_qrel_dict(qrels["dev"]))
        else:
            qids = sorted(tr)
            # carved by query text: the documents are the corpus every split ranks (216 of SciFact's 339
            # test-relevant documents are train positives), so dev, like test, may share relevant documents
            # with train queries. Carving by document too leaves a dev of never-trained documents that
            # selects epoch 1 and cost 0.10 nDCG@10 on SciFact test (measured): dev must look like test.
            is_dev, dropped, dev_note = carve_dev([[q_text[q]] for q in qids], "queries")
            dev_note += "; documents are the shared corpus, as for test"
            eval_sets["dev"] = ir_split({q: tr[q] for q, dev in zip(qids, is_dev) if dev})
            tr = {q: tr[q] for q, dev, drop in zip(qids, is_dev, dropped) if not dev and not drop}
        pairs = [(q, d) for q in sorted(tr) for d, g in sorted(tr[q].items()) if g > 0]
        a = store_rows(store, [q_text[q] for q, _ in pairs], f"{ds.path} train queries", "query")
        p = np.array([doc_row[d] for _, d in pairs], dtype=np.int64)
        train = PairSet(a, p)
        relevant = set(zip(a.tolist(), p.tolist()))
    for split in ("dev", "test", "train"):
        if split in qrels and split not in eval_sets and (for_eval or split != "train"):
            eval_sets[split] = ir_split(_qrel_dict(qrels[split]))
    if train is None and not for_eval:
        raise ValueError(f"{ds.path}: no qrels/train.tsv to train on (splits found: "
                         f"{', '.join(sorted(qrels)) or 'none'}); train on another dataset and `cli eval` this one")
    return Task(ds.name, KIND.name, train, eval_sets, dev_note, doc_rows, relevant, EVALUATION)


def retrieval_split(store, anchors: list[str], positives: list[str], where: str,
                    anchor_role: str = "document") -> IRSplit:
    """Pairs as retrieval: each unique anchor (in `anchor_role`) ranks every unique positive (documents); its
    own positives are relevant. Ids are text ids, whatever the role, so a query's own text is found."""
    qrels: dict[str, dict[str, int]] = {}
    query_text: dict[str, str] = {}
    doc_text_of: dict[str, str] = {}
    for a, p in zip(anchors, positives):
        qa, dp = text_id(a), text_id(p)
        query_text.setdefault(qa, a)
        doc_text_of.setdefault(dp, p)
        qrels.setdefault(qa, {})[dp] = 1
    qids, dids = list(query_text), list(doc_text_of)
    return IRSplit(qids, store_rows(store, [query_text[q] for q in qids], where, anchor_role), dids,
                   store_rows(store, [doc_text_of[d] for d in dids], where, "document"), qrels, exclude_self=True,
                   texts={"query": query_text, "document": doc_text_of})
