"""TREC run files of a head on an IR task, so anyone can check metrics.json with trec_eval.

`run.<split>.trec`, one line per (query, retrieved document), best first, top `IR_TOPK` (100):

    <query_id> Q0 <doc_id> <rank> <score> <run_name>

score = -energy (trec_eval ranks by descending score), written with 9 significant digits so float32
energies round-trip and distinct energies stay distinct. The ranking is computed exactly as the
evaluator computes it (`heads.evaluate`: head outputs, `pairwise_energy`, `topk_ranking`), so
`trec_eval -m ndcg_cut.10 -m recall.100 -m map_cut.100` on these files reproduces metrics.json.
"""
from __future__ import annotations

from pathlib import Path

import torch

from headstore.data.files import atomic_write_text
from headstore.heads.energy import pairwise_energy
from headstore.heads.evaluate import IR_TOPK, embed_rows
from headstore.heads.metrics import topk_ranking
from headstore.heads.tasks import IRSplit, Task

RANK_CHUNK = 256  # queries per top-k pass, as in the evaluator


def trec_lines(split: IRSplit, q: torch.Tensor, d: torch.Tensor, energy: str, run_name: str,
               k: int = IR_TOPK) -> list[str]:
    """Run lines for one split: q (Q, dim) and d (N, dim) head outputs of its queries and corpus."""
    idx, val = topk_ranking(lambda s, e: pairwise_energy(energy, q[s:e], d), k=k, n_queries=q.shape[0],
                            chunk_size=RANK_CHUNK, return_energies=True)
    lines = []
    for qi, qid in enumerate(split.query_ids):
        for rank, (j, e) in enumerate(zip(idx[qi].tolist(), val[qi].tolist()), start=1):
            lines.append(f"{qid} Q0 {split.doc_ids[j]} {rank} {-e:.9g} {run_name}")
    return lines


def write_trec_runs(task: Task, features: torch.Tensor, model, norm, energy: str, splits: tuple[str, ...],
                    out_dir: str | Path, run_name: str = "headstore") -> list[Path]:
    """Write `run.<split>.trec` for every IR split of `splits` present (nothing for STS/pairs tasks)."""
    if task.kind != "ir":
        return []
    X = norm(features) if norm is not None else features
    written = []
    for split in splits:
        data = task.eval_sets.get(split)
        if not isinstance(data, IRSplit):
            continue
        q = embed_rows(model, X, data.query_rows)[0]  # (Q, d)
        d = embed_rows(model, X, data.doc_rows)[0]  # (N, d)
        path = Path(out_dir) / f"run.{split}.trec"
        atomic_write_text(path, "\n".join(trec_lines(data, q, d, energy, run_name.replace(" ", "_"))) + "\n")
        written.append(path)
    return written
