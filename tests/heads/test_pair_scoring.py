"""Scoring a split's pairs for a stack of heads (heads.kinds.tables.evaluate_pairs): each energy taken over every
head at once gives each head the metrics and items of the one-head-at-a-time loop, bit for bit, and a head with a
NaN or inf output scores NaN as it did; the STS selection (Spearman alone) equals evaluate's Spearman."""
import math

import numpy as np
import torch

from headstore.heads.kinds import PREFIX, kind_of
from headstore.heads.scoring.energy import ENERGIES
from headstore.heads.scoring.metrics import sts_metrics

from .synthetic import planted_sts_task


def _loop(data, za, zb, energies, nan_metrics):
    """The reference: one head at a time (the loop evaluate_pairs ran before)."""
    results, items = [], []
    for h in range(za.shape[0]):
        if not (torch.isfinite(za[h]).all() and torch.isfinite(zb[h]).all()):
            results.append(nan_metrics(energies))
            items.append({PREFIX[e]: np.full(len(data), np.nan) for e in energies})
            continue
        m, it = {}, {}
        for energy in energies:
            e = ENERGIES[energy](za[h], zb[h]).double().cpu().numpy()
            s = sts_metrics(-e, data.labels)
            m.update({f"spearman_{PREFIX[energy]}": s["spearman"], f"pearson_{PREFIX[energy]}": s["pearson"]})
            it[PREFIX[energy]] = -e
        results.append(m)
        items.append(it)
    return results, items


def test_pairs_scored_over_every_head_at_once_equal_the_loop():
    task, X = planted_sts_task(n_pairs=300)
    data = task.eval_sets["dev"]
    torch.manual_seed(0)
    W = torch.randn(6, X.shape[1], 8)
    out = torch.einsum("nd,hdo->hno", X, W)  # (H, N, 8): six "heads"
    out[2, data.anchor[5]] = float("nan")  # a head with a NaN output, one with an inf
    out[4, data.positive[0], 3] = float("inf")
    embed = lambda rows, role="query": out[:, torch.as_tensor(np.asarray(rows))]  # noqa: E731
    kind = kind_of(task)
    energies = ("l1", "cosine", "l2")
    got = kind.evaluate(task, "dev", embed, energies)
    want = _loop(data, out[:, data.anchor], out[:, data.positive], energies, kind.nan_metrics)
    assert got[0] == want[0] or all(  # NaN != NaN: compared key by key
        all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in b) for a, b in zip(*[got[0], want[0]]))
    assert [set(r) for r in got[0]] == [set(r) for r in want[0]]
    assert all(math.isnan(v) for h in (2, 4) for v in got[0][h].values())
    for a, b in zip(got[1], want[1]):
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])
    for energy in energies:
        sel = kind.selection_scores(task, "dev", embed, energy, "fp32")
        ref = [r[kind.primary_metric(energy)] for r in want[0]]
        assert [s for s in sel if not math.isnan(s)] == [r for r in ref if not math.isnan(r)]
        assert [math.isnan(s) for s in sel] == [math.isnan(r) for r in ref] == [False, False, True, False, True, False]
