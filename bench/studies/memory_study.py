"""The document memory and a head that does no harm on new documents (issue 53 parts 2 and 3, docs/memory.md).

On a store of SciFact alone: the frozen features, frozen + memory, and for each approach to training the head
(3 seeds in one stack) the head, head + memory before it (on its inputs) and after it (on its outputs), scored on
SciFact test split into seen claims (a relevant abstract judged in training) and unseen ones, with two-level 95%
CIs (heads.scoring.bootstrap) against the frozen features; and each head out of domain (Cranfield, CACM: the
memory has nothing there) against the frozen features, from a second store holding those datasets too (the same
fingerprint: the head is trained on SciFact's store alone, so its anchor samples SciFact only).

    python3 bench/studies/memory_study.py --store STORE --ood-store OOD_STORE --work DIR --json OUT.json

Each approach's scored items are cached in DIR/<approach>.json (resumable); the table is printed from them.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))

from headstore.featurize.store.reader import FeatureStore  # noqa: E402
from headstore.heads.artefacts.memory import PlacedMemory  # noqa: E402
from headstore.heads.artefacts.task_features import TaskFeatures  # noqa: E402
from headstore.heads.evaluation.evaluate import embedder  # noqa: E402
from headstore.heads.experiments.compare.datasets_root import datasets_root  # noqa: E402
from headstore.heads.kinds import PairSet, kind_of, load_task  # noqa: E402
from headstore.heads.kinds.seen import judged_documents, seen_mask  # noqa: E402
from headstore.heads.scoring.bootstrap import two_level_ci  # noqa: E402
from headstore.heads.settings.config import KIND_DEPENDENT, HeadConfig, TrainConfig  # noqa: E402
from headstore.heads.training.memory_fit import dev_pairs, fit_memory  # noqa: E402
from headstore.heads.training.run import defaults_for_kind, head_shape  # noqa: E402
from headstore.heads.training.train import train_stack  # noqa: E402
from limits import machine, machine_line  # noqa: E402

OOD = ("cranfield", "cacm")
N_BOOT = 1000
# approach -> what changes from train-head's defaults (docs/memory.md says why each)
APPROACHES = {
    "default": {},
    "unseen-dev": {"select": "dev-unseen"},  # epochs chosen on the dev claims whose abstracts training never judged
    "one-per-doc": {"one_per_doc": True},  # each judged abstract trains once per epoch (no abstract dominates)
    "doc-dev": {"select": "dev-docs"},  # a document-disjoint dev carved from training: epochs chosen on new documents
    "anchor-5": {"cfg": {"anchor_weight": 5.0}},  # a stronger pull to the frozen geometry (default 2)
    "residual": {"residual": True},  # trained where the memory has already moved the judged abstracts
    "residual+doc-dev": {"residual": True, "select": "dev-docs"},
    # epochs and the head's strength a (f_a = x + a g(x), heads.training.strength) both chosen on new documents
    "doc-dev+strength": {"select": "dev-docs", "cfg": {"strength": "auto"}},
    # only queries pass through the head: documents keep their frozen features, so it cannot learn where they lie
    "query-side": {"head": {"sides": "query"}},
}


def ndcg_items(task, split, model, norm, features, memory=None, energy="l1") -> np.ndarray:
    """(H, Q) per-query nDCG@10 of every head of `model` (None: the frozen features) on `split`."""
    embed = embedder(model, features, norm, memory)
    _, items = kind_of(task).evaluate_splits(task, (split,), embed, (energy,))[split]
    prefix = {"l1": "manhattan", "cosine": "cosine"}[energy]
    return np.stack([it[prefix] for it in items])


def placed(fm) -> PlacedMemory:
    return PlacedMemory(fm.positions, fm.vectors, fm.space)


def unseen_dev(task):
    dev = task.eval_sets["dev"]
    mask = ~seen_mask(dev, judged_documents(task.train.positive))
    ids = [q for q, m in zip(dev.query_ids, mask) if m]
    return dataclasses.replace(dev, query_ids=ids, query_rows=dev.query_rows[mask], qrels={q: dev.qrels[q] for q in ids})


def document_disjoint(task, share: float = 0.1, seed: int = 0):
    """(training pairs, dev split): whole components of the training judgements' query-document graph moved out of
    training into a dev split until it holds `share` of the training queries, so no dev document is judged in
    what is left: a dev of new documents (every dev query unseen), ranked against the whole corpus."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    a, p = np.asarray(task.train.anchor), np.asarray(task.train.positive)
    nodes, inv = np.unique(np.concatenate([a, p + (a.max() + 1)]), return_inverse=True)  # queries and documents
    qa, qp = inv[:len(a)], inv[len(a):]
    graph = coo_matrix((np.ones(len(a)), (qa, qp)), shape=(len(nodes), len(nodes)))
    _, label = connected_components(graph, directed=False)
    comps = np.random.default_rng(seed).permutation(np.unique(label[qa]))
    target, moved, n_moved = share * len(np.unique(a)), [], 0
    for c in comps:
        if n_moved >= target:
            break
        moved.append(c)
        n_moved += len(np.unique(a[label[qa] == c]))
    out = np.isin(label[qa], moved)
    test = task.eval_sets["test"]
    doc_id = dict(zip(np.asarray(test.doc_rows).tolist(), test.doc_ids))
    qrels: dict = {}
    for q, d in zip(a[out], p[out]):
        qrels.setdefault(f"q{int(q)}", {})[doc_id[int(d)]] = 1
    ids = sorted(qrels)
    dev = dataclasses.replace(test, query_ids=ids, query_rows=np.array([int(q[1:]) for q in ids]), qrels=qrels)
    return task.train.subset(np.flatnonzero(~out)), dev


def one_per_doc(train: PairSet, seed: int) -> PairSet:
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(train))
    _, first = np.unique(train.positive[order], return_index=True)
    return train.subset(np.sort(order[first]))


def setup(store_path: str, data: str):
    store = FeatureStore.open(store_path)
    task = load_task(data, store)
    head_cfg, cfg, _ = defaults_for_kind(task, HeadConfig(), TrainConfig(), KIND_DEPENDENT)
    tf = TaskFeatures(store, None)  # a store of SciFact alone: every row (the anchor's sample too)
    return store, tf.remap(task), tf.read("features"), head_cfg, cfg


def frozen_part(task, X) -> dict:
    """The frozen features and frozen + memory (nudge-n and nudge-m on them), dev and test items."""
    out = {"frozen": {s: ndcg_items(task, s, None, None, X, energy="cosine")[0].tolist() for s in ("dev", "test")}}
    for mv in ("nudge-n", "nudge-m"):
        fm = fit_memory(task, X, None, None, "cosine", "features", mv)
        out[f"frozen+memory[{mv}]"] = {s: ndcg_items(task, s, None, None, X, placed(fm), "cosine")[0].tolist()
                                        for s in ("dev", "test")}
        out[f"frozen+memory[{mv}]"]["fit"] = fm.describe()
    return out


def run_approach(name, spec, task, X, head_cfg, cfg, seeds, ood) -> dict:
    t0 = time.perf_counter()
    cfg = cfg.replace(**spec.get("cfg", {}))
    head_cfg = dataclasses.replace(head_cfg, **spec.get("head", {}))
    train_X, frozen_mem = X, None
    if spec.get("residual"):  # the judged abstracts' features moved by the frozen memory, for training and after
        frozen_mem = fit_memory(task, X, None, None, "cosine", "features", "nudge-n", refit=False)  # dev kept clean
        train_X = X.clone()
        train_X[torch.as_tensor(frozen_mem.positions)] = frozen_mem.vectors
    work = task
    if spec.get("select") == "dev-unseen":
        work = dataclasses.replace(task, eval_sets={**task.eval_sets, "dev-unseen": unseen_dev(task)})
    if spec.get("select") == "dev-docs":  # trained without the moved judgements; the memory keeps all of them
        train, dev_docs = document_disjoint(task)
        work = dataclasses.replace(task, train=train, eval_sets={**task.eval_sets, "dev-docs": dev_docs})
    out = {"heads": [], "spec": {k: v for k, v in spec.items()}}
    shaped = head_shape(head_cfg, train_X, "features", work, cfg)
    select = spec.get("select", "dev")
    if spec.get("one_per_doc"):  # each seed draws its own pairs: one stack per seed
        trained = [train_stack(dataclasses.replace(work, train=one_per_doc(task.train, seed)), train_X, shaped,
                               [cfg.replace(seed=seed)], progress=False, select_split=select) for seed in seeds]
        heads = [(model, norm, run) for model, norm, (run,) in trained]
    else:  # the seeds as one stack (per-head seeds: the numbers of separate runs)
        model, norm, runs = train_stack(work, train_X, shaped, [cfg.replace(seed=s) for s in seeds], progress=False,
                                        select_split=select)
        heads = [(model.head_slice(h), norm, run) for h, run in enumerate(runs)]
    for model, norm, run in heads:
        out["heads"].append(score_head(task, X, train_X, model, norm, run, ood))
    if frozen_mem is not None:
        out["frozen_memory"] = frozen_mem.describe()
    out["seconds"] = time.perf_counter() - t0
    return out


def score_head(task, X, X_mem, model, norm, run, ood) -> dict:
    """One head: alone (on X), + memory before it, + memory after it (its energy's move, and nudge-n for contrast),
    the memories on X_mem (the residual approach: the features the head trained on, judged abstracts moved)."""
    res = {"best_epoch": run.best_epoch, "train_seconds": run.seconds}
    res["head"] = {s: ndcg_items(task, s, model, norm, X)[0].tolist() for s in ("dev", "test")}
    if X_mem is not X:
        res["head+memory[carried]"] = {s: ndcg_items(task, s, model, norm, X_mem)[0].tolist() for s in ("dev", "test")}
    for label, space, mv in (("before", "features", None), ("after", "outputs", None),
                             ("after[nudge-n]", "outputs", "nudge-n")):
        fm = fit_memory(task, X_mem, model, norm, "l1", space, mv)
        res[f"head+memory[{label}]"] = {s: ndcg_items(task, s, model, norm, X_mem, placed(fm))[0].tolist()
                                        for s in ("dev", "test")}
        res[f"head+memory[{label}]"]["fit"] = fm.describe()
    res["ood"] = {name: ndcg_items(t, "test", model, norm, F)[0].tolist() for name, (t, F) in ood.items()}
    return res


def ood_sets(store_path: str | None, root: Path) -> dict:
    if not store_path:
        return {}
    store = FeatureStore.open(store_path)
    out = {}
    for name in OOD:
        task = load_task(str(root / name), store, for_eval=True)
        tf = TaskFeatures.for_task(store, task)
        out[name] = (tf.remap(task), tf.read("features"))
    return out


def ci_line(values: np.ndarray, minus: np.ndarray | None = None) -> tuple[float, float, float, float]:
    """(mean over seeds of the mean over items, or with `minus` the paired difference; CI low, CI high; the
    mean itself)."""
    values = np.atleast_2d(values)
    mean = float(values.mean() - (0 if minus is None else np.atleast_2d(minus).mean()))
    if values.shape[1] < 2:
        return mean, float("nan"), float("nan"), float(values.mean())
    lo, hi = two_level_ci(values, N_BOOT, minus=None if minus is None else np.broadcast_to(minus, values.shape))
    return mean, lo, hi, float(values.mean())


def parts(task) -> dict:
    """Seen: a relevant document judged in the dataset's training judgements (train and the dev carved from it: the
    memory's documents), as issue 53's table splits SciFact's 300 claims (196 seen, 104 unseen)."""
    test = task.eval_sets["test"]
    seen = seen_mask(test, judged_documents(np.concatenate([task.train.positive, dev_pairs(task)[1]])))
    return {"seen": seen, "unseen": ~seen, "all": np.ones_like(seen)}


def fit_dev(entry: dict) -> float:
    """The dev nDCG@10 a memory was chosen at (fitted on train; its vectors are then refitted on train + dev, so
    its own dev items are no held-out figure); a memory-less entry: its dev mean."""
    fit = entry.get("fit")
    return max(s for _, s in fit["dev_curve"]) if fit else float(np.mean(entry["dev"]))


def chosen_memory(heads: list[dict]) -> str:
    """The head + memory placement with the best mean dev nDCG@10 over seeds (dev only decides)."""
    keys = [k for k in heads[0] if k.startswith("head+memory")]
    return max(keys, key=lambda k: np.mean([fit_dev(h[k]) for h in heads]))


def summarise(task, frozen: dict, results: dict, ood_frozen: dict) -> dict:
    masks, base = parts(task), np.asarray(frozen["frozen"]["test"])
    mem_key = max((k for k in frozen if k.startswith("frozen+memory")), key=lambda k: fit_dev(frozen[k]))
    rows = {"frozen": {p: ci_line(base[m]) for p, m in masks.items()},
            mem_key: {p: ci_line(np.asarray(frozen[mem_key]["test"])[m], base[m]) for p, m in masks.items()}}
    for name, res in results.items():
        heads = res["heads"]
        key = chosen_memory(heads)
        for label, k in (("head", "head"), (f"head+memory ({key[12:-1]})", key)):
            vals = np.array([h[k]["test"] for h in heads])
            rows[f"{name}: {label}"] = {p: ci_line(vals[:, m], base[m]) for p, m in masks.items()}
        for ds, fz in ood_frozen.items():
            vals = np.array([h["ood"][ds] for h in heads])
            rows[f"{name}: head"][ds] = ci_line(vals, np.asarray(fz))
    return rows


def print_table(rows: dict, counts: dict) -> None:
    print(f"nDCG@10 on test: the value, then minus frozen [95% two-level CI over seeds and queries]; seen "
          f"{counts['seen']}, unseen {counts['unseen']}, all {counts['all']} queries; {', '.join(OOD)}: the head alone")
    cols = ("seen", "unseen", "all", *OOD)
    print(f"{'system':40s}" + "".join(f"{c:>31s}" for c in cols))
    for name, row in rows.items():
        cells = [(f"{row[c][3]:.3f}" + (f" {row[c][0]:+.3f} [{row[c][1]:+.3f},{row[c][2]:+.3f}]" if name != "frozen"
                  else "")) if c in row else "" for c in cols]
        print(f"{name:40s}" + "".join(f"{c:>31s}" for c in cells))


def print_placements(results: dict) -> None:
    """Each approach's head and every memory placement: dev (what chooses) and test nDCG@10, all queries."""
    keys = sorted({k for r in results.values() for k in r["heads"][0] if k.startswith("head")})
    print("\nwhere the memory acts (mean of seeds, all queries): dev / test nDCG@10")
    print(f"{'approach':22s}" + "".join(f"{k[12:-1] or k:>30s}" for k in keys))
    for name, r in results.items():
        cells = [f"{np.mean([fit_dev(h[k]) for h in r['heads']]):.3f} / "
                 f"{np.mean([np.mean(h[k]['test']) for h in r['heads']]):.3f}" if k in r["heads"][0] else ""
                 for k in keys]
        print(f"{name:22s}" + "".join(f"{c:>30s}" for c in cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--ood-store", default=None, help="a store with Cranfield and CACM (same fingerprint)")
    ap.add_argument("--work", required=True, help="per-approach caches (resumable)")
    ap.add_argument("--json", required=True)
    ap.add_argument("--data", default=None, help="the IR dataset (default: DATASETS_ROOT/scifact)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--approaches", default=",".join(APPROACHES))
    args = ap.parse_args()
    torch.manual_seed(0)
    root, work = datasets_root(), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    store, task, X, head_cfg, cfg = setup(args.store, args.data or str(root / "scifact"))
    ood = ood_sets(args.ood_store, root)
    frozen = cached(work / "frozen.json", lambda: {**frozen_part(task, X), "ood": {
        n: ndcg_items(t, "test", None, None, F, energy="cosine")[0].tolist() for n, (t, F) in ood.items()}})
    results = {}
    for name in args.approaches.split(","):
        results[name] = cached(work / f"{name}.json",
                               lambda: run_approach(name, APPROACHES[name], task, X, head_cfg, cfg, seeds, ood))
        print(f"{name}: done ({results[name]['seconds']:.0f} s)", flush=True)
    rows = summarise(task, frozen, results, frozen["ood"])
    counts = {p: int(m.sum()) for p, m in parts(task).items()}
    m = machine()
    print(machine_line(m))
    print_table(rows, counts)
    print_placements(results)
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "machine": m,
           "store": args.store, "ood_store": args.ood_store, "seeds": seeds, "counts": counts,
           "rows": rows, "fits": {k: v.get("fit") for k, v in frozen.items() if isinstance(v, dict) and "fit" in v},
           "approaches": {n: {"spec": r["spec"], "seconds": r["seconds"], "chosen_memory": chosen_memory(r["heads"]),
                              "best_epochs": [h["best_epoch"] for h in r["heads"]],
                              "memory_fits": [{k: h[k]["fit"] for k in h if k.startswith("head+memory") and "fit" in h[k]}
                                              for h in r["heads"]],
                              "dev": {k: float(np.mean([fit_dev(h[k]) for h in r["heads"]]))
                                      for k in r["heads"][0] if isinstance(r["heads"][0][k], dict) and "dev" in r["heads"][0][k]}}
                          for n, r in results.items()}}
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")


def cached(path: Path, make):
    if path.exists():
        return json.loads(path.read_text())
    value = make()
    tmp = path.with_suffix(".incomplete")
    tmp.write_text(json.dumps(value))
    tmp.rename(path)
    return value


if __name__ == "__main__":
    main()
