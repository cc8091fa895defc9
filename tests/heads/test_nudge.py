"""The memory's moves (heads.scoring.nudge) against numeric optimisations of their objectives (scipy.optimize)."""
import numpy as np
import pytest
import torch
from scipy.optimize import linprog, minimize

from headstore.heads.scoring.nudge import l1_box, move, nudge_m, nudge_n


def _toy(seed: int, n_docs: int = 4, n_queries: int = 9, dim: int = 5):
    rng = np.random.default_rng(seed)
    D = rng.normal(size=(n_docs, dim))
    D /= np.linalg.norm(D, axis=1, keepdims=True)
    Q = rng.normal(size=(n_queries, dim))
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    owner = rng.integers(0, n_docs, n_queries)
    return D, Q, owner


def _torch(*arrays):
    return [torch.as_tensor(a) for a in arrays]


def _nudge_n_numeric(d: np.ndarray, g: np.ndarray, gamma: float) -> np.ndarray:
    """max g.x s.t. ||x|| = 1, ||x - d|| <= gamma, by SLSQP from several starts (the best kept)."""
    cons = [{"type": "eq", "fun": lambda x: x @ x - 1.0},
            {"type": "ineq", "fun": lambda x: gamma ** 2 - (x - d) @ (x - d)}]
    best = None
    rng = np.random.default_rng(0)
    for start in [d, *(d + 0.3 * rng.normal(size=d.shape) for _ in range(5))]:
        r = minimize(lambda x: -(g @ x), start / np.linalg.norm(start), constraints=cons, method="SLSQP",
                     options={"ftol": 1e-12, "maxiter": 500})
        if r.success and (best is None or -r.fun > -best.fun):
            best = r
    return best.x


@pytest.mark.parametrize("gamma", [0.05, 0.3, 0.8, 1.5, 2.0])
def test_nudge_n_closed_form_equals_numeric_optimum(gamma):
    D, Q, owner = _toy(1)
    out = nudge_n(*_torch(D, Q, owner), gamma).numpy()
    for j in range(len(D)):
        g = Q[owner == j].sum(0)
        if not g.any():
            np.testing.assert_allclose(out[j], D[j])
            continue
        x = _nudge_n_numeric(D[j], g, gamma)
        assert g @ out[j] >= g @ x - 1e-7  # at least as good as the numeric optimum ...
        assert abs(np.linalg.norm(out[j]) - 1) < 1e-9 and np.linalg.norm(out[j] - D[j]) <= gamma + 1e-9  # feasible
        np.testing.assert_allclose(out[j], x, atol=1e-4)  # ... and the same point (the optimum is unique)


def test_nudge_n_unbounded_is_the_query_direction_and_zero_is_no_move():
    D, Q, owner = _toy(2)
    t = _torch(D, Q, owner)
    g = np.stack([Q[owner == j].sum(0) for j in range(len(D))])
    has = np.linalg.norm(g, axis=1) > 0
    np.testing.assert_allclose(nudge_n(*t, 2.0).numpy()[has], g[has] / np.linalg.norm(g[has], axis=1, keepdims=True),
                               atol=1e-12)
    np.testing.assert_allclose(nudge_n(*t, 0.0).numpy(), D, atol=1e-7)


def test_nudge_m_closed_form_equals_numeric_optimum():
    D, Q, owner = _toy(3)
    gamma = 0.4
    out = nudge_m(*_torch(D, Q, owner), gamma).numpy()
    for j in range(len(D)):
        g = Q[owner == j].sum(0)
        cons = [{"type": "ineq", "fun": lambda x: gamma ** 2 - x @ x}]
        r = minimize(lambda x: -(g @ (D[j] + x)), np.zeros_like(D[j]), constraints=cons, method="SLSQP",
                     options={"ftol": 1e-12})
        np.testing.assert_allclose(out[j] - D[j], r.x if g.any() else 0 * r.x, atol=1e-4)


def _l1_numeric(d: np.ndarray, q: np.ndarray, gamma: float) -> float:
    """min sum_i ||q_i - x||_1 s.t. |x_k - d_k| <= gamma as a linear programme (x, t_ik >= |q_ik - x_k|)."""
    P, k = q.shape
    c = np.concatenate([np.zeros(k), np.ones(P * k)])
    rows, rhs = [], []
    for i in range(P):
        for j in range(k):
            for sign in (1, -1):  # sign * (q_ij - x_j) <= t_ij
                row = np.zeros(k + P * k)
                row[j], row[k + i * k + j] = sign, -1
                rows.append(row)
                rhs.append(sign * q[i, j])
    bounds = [(d[j] - gamma, d[j] + gamma) for j in range(k)] + [(0, None)] * (P * k)
    return linprog(c, A_ub=np.array(rows), b_ub=np.array(rhs), bounds=bounds).fun


@pytest.mark.parametrize("gamma", [0.0, 0.05, 0.2, 1.0, 10.0])
def test_l1_box_is_optimal_for_the_l1_energy(gamma):
    D, Q, owner = _toy(4, n_docs=3, n_queries=10)
    out = l1_box(*_torch(D, Q, owner), gamma).numpy()
    for j in range(len(D)):
        q = Q[owner == j]
        if not len(q):
            np.testing.assert_array_equal(out[j], D[j])
            continue
        assert np.abs(out[j] - D[j]).max() <= gamma + 1e-12
        assert np.abs(q - out[j]).sum() <= _l1_numeric(D[j], q, gamma) + 1e-7
    # the L1 move is not the L2 one: with one far query per coordinate side, the median ignores the outlier
    d = np.zeros((1, 2))
    q = np.array([[1.0, 0.0], [1.0, 0.0], [-50.0, 0.0]])
    mean_dir = nudge_m(*_torch(d, q, np.zeros(3, dtype=np.int64)), 1.0).numpy()
    assert l1_box(*_torch(d, q, np.zeros(3, dtype=np.int64)), 1.0).numpy()[0, 0] == 1.0 and mean_dir[0, 0] < 0


def test_bad_move_and_strength_are_one_line_errors():
    D, Q, owner = _torch(*_toy(5))
    with pytest.raises(ValueError, match="valid: \\['l1-box', 'nudge-m', 'nudge-n'\\]"):
        move("nudge-x", D, Q, owner, 0.1)
    with pytest.raises(ValueError, match=">= 0"):
        move("nudge-n", D, Q, owner, -1.0)
