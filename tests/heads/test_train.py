import dataclasses

import numpy as np
import pytest
import torch

from headstore.heads.settings.config import TrainConfig
from headstore.heads.evaluation.evaluate import embedder, evaluate_split
from headstore.heads.settings.config import HeadConfig
from headstore.heads.network.model import StackedMLP
from headstore.heads.training.optim import lr_factor
from headstore.heads.training.train import TrainingDiverged, train_one, train_stack

from .synthetic import planted_ir_task, planted_sts_task


def test_head_learns_planted_ir_relation():
    task, X = planted_ir_task()
    base, _ = evaluate_split(task, "test", embedder(None, X), ("cosine", "l1"))
    head_cfg = HeadConfig(depth=1, out_dim=16, in_dim=16, residual=False)
    cfg = TrainConfig(normalize="none", impostors="all", mined_k=0, loss="l1-energy", epochs=15, batch_size=32, lr=1e-2, patience=15, q=8.0)
    model, norm, run = train_one(task, X, head_cfg, cfg, progress=False)
    res, _ = evaluate_split(task, "test", embedder(model, norm(X)), ("l1",))
    chance = 1 / 80  # 80 test queries, one relevant doc among 400
    assert base[0]["cosine_ndcg@10"] < 0.1
    assert res[0]["manhattan_ndcg@10"] > 0.9, res[0]
    assert res[0]["manhattan_ndcg@10"] > 10 * chance
    assert run.best_epoch >= 1 and len(run.history) >= run.best_epoch


@pytest.mark.parametrize("loss,graded", [("l1-energy", "weight"), ("l1-energy", "pearson"), ("l1-energy", "regress"),
                                         ("cosent", "weight")])
def test_head_learns_planted_sts_relation(loss, graded):
    task, X = planted_sts_task()
    base, _ = evaluate_split(task, "test", embedder(None, X), ("cosine",))
    head_cfg = HeadConfig(depth=1, out_dim=8, in_dim=16, residual=False)
    cfg = TrainConfig(normalize="none", impostors="all", mined_k=0, loss=loss, epochs=40, batch_size=32, lr=1e-2,
                      patience=40, q=4.0, graded=graded)
    model, norm, _ = train_one(task, X, head_cfg, cfg, progress=False)
    res, _ = evaluate_split(task, "test", embedder(model, norm(X)), ("l1",))
    assert res[0]["spearman_manhattan"] > base[0]["spearman_cosine"] + 0.25, (res, base)


def test_stacked_training_equals_separate_heads():
    task, X = planted_ir_task(n_docs=120)
    head_cfg = HeadConfig(depth=2, hidden=32, out_dim=8, in_dim=16, residual=False)
    base = TrainConfig(normalize="none", impostors="all", mined_k=0, loss="l1-energy", epochs=3, batch_size=16, patience=10, q=8.0)
    configs = [dataclasses.replace(base, lr=lr, weight_decay=wd, seed=s)
               for lr, wd, s in [(1e-3, 0.0, 0), (3e-3, 0.1, 1), (1e-2, 0.01, 2)]]
    stacked, _, runs = train_stack(task, X, head_cfg, configs, progress=False)
    for h, cfg in enumerate(configs):
        alone, _, (run,) = train_stack(task, X, head_cfg, [cfg], progress=False)
        for p_stack, p_alone in zip(stacked.parameters(), alone.parameters()):
            torch.testing.assert_close(p_stack[h], p_alone[0], rtol=1e-4, atol=1e-5)
        assert run.best_epoch == runs[h].best_epoch
        assert [r["loss"] for r in run.history] == pytest.approx([r["loss"] for r in runs[h].history], rel=1e-4)
    # the heads really trained and differ from their init
    fresh = StackedMLP(3, head_cfg, seeds=[0, 1, 2])
    assert not torch.allclose(fresh.weights[0], stacked.weights[0])


@pytest.mark.parametrize("exact_max,ood", [(20_000, False), (0, False), (20_000, True)])  # re-mined over the
# whole corpus; over candidate pools; with an out-of-domain selection set (its loss is a dev score too)
def test_stopped_heads_are_neither_remined_nor_rescored(exact_max, ood):
    """Heads stopping at different epochs: each one's run up to its stop is the run it has alone (re-mined in
    its own space while it trains), and after it its dev score (and out-of-domain loss) is the one it stopped with."""
    from headstore.heads.training.selection import OodSelection
    task, X = planted_ir_task(n_docs=120)
    head_cfg = HeadConfig(depth=2, hidden=32, out_dim=8, in_dim=16, residual=False)
    base = TrainConfig(normalize="none", impostors="all", mined_k=4, loss="l1-energy", epochs=8, batch_size=16,
                       patience=2, q=8.0, exact_max=exact_max, pool_k=30)
    configs = [dataclasses.replace(base, lr=lr, seed=s) for s, lr in enumerate([3e-3, 1e-3, 3e-4, 1e-4, 3e-3, 1e-3])]
    selection = OodSelection({"ood": (task, "test")}, {"ood": 0.5}, delta=1.0) if ood else None  # the mechanics only
    stacked, _, runs = train_stack(task, X, head_cfg, configs, progress=False, selection=selection)
    metric = "dev_manhattan_ndcg@10"
    keys = [metric, "ood_dev_loss"] if ood else [metric]
    stops = []
    for h, cfg in enumerate(configs):
        alone, _, (run,) = train_stack(task, X, head_cfg, [cfg], progress=False, selection=selection)
        n = len(run.history)  # alone, the loop ends when the head stops
        stops.append(n)
        assert run.best_epoch == runs[h].best_epoch and run.best_dev == runs[h].best_dev
        assert len(runs[h].history) == n  # the history ends where the head stopped, as alone
        for key in keys:
            assert [r[key] for r in run.history] == [r[key] for r in runs[h].history]
        assert [r["loss"] for r in run.history] == pytest.approx([r["loss"] for r in runs[h].history[:n]], rel=1e-4)
        for p_stack, p_alone in zip(stacked.parameters(), alone.parameters()):
            torch.testing.assert_close(p_stack[h], p_alone[0], rtol=1e-4, atol=1e-5)
    assert len(set(stops)) > 2 and min(stops) < base.epochs, stops  # the heads did stop at different epochs


@pytest.mark.parametrize("decay_to_init,anchor", [(0.0, 0.0), (0.01, 0.1)])
def test_a_stack_steps_only_the_heads_still_training(monkeypatch, decay_to_init, anchor):
    """Heads that stopped leave the stack's steps at the next epoch: every step computes the heads alive at its
    epoch's start, no more (counted in the step's forward pass), and each head still ends as it does alone."""
    import headstore.heads.training.train as train_module
    task, X = planted_ir_task(n_docs=120)
    head_cfg = HeadConfig(depth=2, hidden=32, out_dim=16, in_dim=16, residual=True)
    base = TrainConfig(normalize="none", impostors="all", mined_k=4, loss="l1-energy", epochs=8, batch_size=16,
                       patience=1, q=8.0, decay_to_init=decay_to_init, anchor_weight=anchor)
    configs = [dataclasses.replace(base, lr=lr, seed=s) for s, lr in enumerate([3e-2, 1e-3, 3e-4, 1e-2])]
    stepped, real = [], train_module.batch_losses
    monkeypatch.setattr(train_module, "batch_losses",
                        lambda model, *a, **k: stepped.append(model.n_heads) or real(model, *a, **k))
    stacked, _, runs = train_stack(task, X, head_cfg, configs, progress=False)
    ends = sorted(len(r.history) for r in runs)  # the epochs each head trained
    per_epoch = [sum(e > epoch for e in ends) for epoch in range(max(ends))]  # heads alive at each epoch's start
    assert len(set(ends)) > 1 and stepped[0] == len(configs), ends
    n_steps = len(stepped) // max(ends)
    assert stepped == [n for n in per_epoch for _ in range(n_steps)], per_epoch
    for h, cfg in enumerate(configs):
        alone, _, (run,) = train_stack(task, X, head_cfg, [cfg], progress=False)
        assert run.best_epoch == runs[h].best_epoch and len(run.history) == len(runs[h].history)
        for p_stack, p_alone in zip(stacked.parameters(), alone.parameters()):
            torch.testing.assert_close(p_stack[h], p_alone[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("head_cfg", [HeadConfig(depth=0, in_dim=16),
                                      HeadConfig(depth=2, hidden=32, out_dim=None, residual=True, in_dim=16),
                                      HeadConfig(depth=1, out_dim=None, init="identity", in_dim=16)])
def test_identity_initialised_head_reproduces_baseline_exactly(head_cfg):
    task, X = planted_ir_task()
    model = StackedMLP(1, head_cfg, seeds=[0])
    base, _ = evaluate_split(task, "test", embedder(None, X), ("l1", "cosine"))
    head, _ = evaluate_split(task, "test", embedder(model, X), ("l1", "cosine"))
    assert head[0] == base[0]


def test_diverging_head_fails_alone_and_train_one_names_the_step():
    task, X = planted_ir_task(n_docs=120)
    head_cfg = HeadConfig(depth=2, hidden=32, out_dim=8, in_dim=16, residual=False)
    good = TrainConfig(normalize="none", impostors="all", mined_k=0, loss="contrastive", epochs=2, batch_size=16, grad_clip=0.0)
    bad = dataclasses.replace(good, lr=1e12, seed=1)  # weights explode -> inf/NaN loss
    _, _, runs = train_stack(task, X, head_cfg, [good, bad], progress=False)
    assert runs[0].status == "ok" and np.isfinite(runs[0].best_dev)
    assert runs[1].status == "failed" and "step" in runs[1].reason
    with pytest.raises(TrainingDiverged, match="step"):
        train_one(task, X, head_cfg, bad, progress=False)


def test_lr_schedule_warms_up_then_decays():
    cfg = TrainConfig(warmup_ratio=0.1, schedule="cosine")
    f = [lr_factor(s, 100, cfg) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:])) and f[-1] < 0.01
    lin = TrainConfig(warmup_ratio=0.0, schedule="linear")
    assert lr_factor(50, 100, lin) == pytest.approx(0.5)


def test_mined_negatives_exclude_positives_and_remine_runs():
    from headstore.heads.evaluation.mining import mine_negatives

    task, X = planted_ir_task(n_docs=120)
    mined = mine_negatives(X, task.train.anchor, task.corpus_rows, task.relevant, 5)
    assert mined.shape == (1, len(task.train), 5)
    for a, p, negs in zip(task.train.anchor, task.train.positive, mined[0].tolist()):
        assert p not in negs
    cfg = TrainConfig(normalize="none", impostors="all", loss="l1-energy", epochs=2, batch_size=16, mined_k=3, remine=True, q=8.0)
    _, _, (run,) = train_stack(task, X, HeadConfig(depth=1, out_dim=8, in_dim=16, residual=False), [cfg], progress=False)
    assert run.status == "ok"


@pytest.mark.parametrize("remine, every, calls", [(False, 1, 1), (True, 1, 3), (True, 2, 2)])
def test_mining_runs_once_unless_remine(monkeypatch, remine, every, calls):
    import headstore.heads.training.batches as train_module
    from headstore.heads.evaluation.mining import mine

    seen = []

    def counting(*args, **kwargs):
        seen.append(args[2] is not None)  # embed given: mined in the head's own space
        return mine(*args, **kwargs)

    monkeypatch.setattr(train_module, "mine", counting)
    task, X = planted_ir_task(n_docs=120)
    cfg = TrainConfig(normalize="none", loss="l1-energy", epochs=3, batch_size=16, mined_k=3, remine=remine,
                      patience=10, q=8.0, remine_every=every)  # every 2: frozen at epoch 0, head space at 2
    _, _, (run,) = train_stack(task, X, HeadConfig(depth=1, out_dim=8, in_dim=16, residual=False), [cfg], progress=False)
    assert run.status == "ok" and len(run.history) == 3
    assert len(seen) == calls and seen == [False] + [True] * (calls - 1)


def test_a_duplicated_positive_is_never_mined_as_its_own_negative():
    from headstore.heads.evaluation.mining import mine_negatives

    rng = np.random.default_rng(0)
    X = torch.tensor(rng.standard_normal((12, 8)), dtype=torch.float32)
    X[1] = X[0] + 0.01  # the anchor (row 0) is closest to its positive (row 1)
    corpus = np.array([1, 2, 3, 1, 4, 5, 6, 7, 8, 9, 10, 11])  # row 1 listed twice (two ids, one text)
    mined = mine_negatives(X, np.array([0]), corpus, {(0, 1)}, k=5)
    assert 1 not in mined[0, 0].tolist() and len(set(mined[0, 0].tolist())) == 5


def test_positive_pair_losses_on_a_table_without_positives_are_an_error():
    task, X = planted_sts_task()
    low = dataclasses.replace(task, train=dataclasses.replace(task.train, labels=task.train.labels * 0.5))
    with pytest.raises(ValueError, match="no train pair has a label >= 0.8"):
        train_one(low, X, HeadConfig(depth=1, out_dim=8, in_dim=16, residual=False), TrainConfig(loss="mnr"),
                  progress=False)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_lr_schedule_is_transformers_schedule_with_the_warmup_counting_the_update(schedule):
    import transformers.optimization as hf

    from headstore.featurize.tuning.schedule import lr_lambda

    make = {"cosine": hf.get_cosine_schedule_with_warmup, "linear": hf.get_linear_schedule_with_warmup,
            "constant": hf.get_constant_schedule_with_warmup}[schedule]
    total, warm = 50, 7
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    kwargs = {} if schedule == "constant" else {"num_training_steps": total}
    sched = make(opt, num_warmup_steps=warm, **kwargs)
    reference = []  # the lr transformers' scheduler gives each update (stepped after the optimiser)
    for _ in range(total + 1):
        reference.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    f = lr_lambda(schedule, warm, total)
    assert [f(s) for s in range(warm)] == pytest.approx(reference[1:warm + 1])  # warm-up: the update being taken counts
    assert [f(s) for s in range(warm, total)] == pytest.approx(reference[warm:total])
    assert f(warm - 1) == 1.0


def test_q_schedule_goes_from_q_start_to_q():
    from headstore.heads.scoring.losses.settings import DEFAULT_Q
    from headstore.heads.training.resolved import resolve_stack

    def q_at(cfg, step, total):
        return resolve_stack([cfg]).q_at(step, total)

    assert q_at(TrainConfig(), 5, 100) is None  # no schedule: the loss takes cfg's q
    cfg = TrainConfig(q_start=30.0, q=10.0)
    assert [q_at(cfg, s, 11) for s in (0, 5, 10)] == pytest.approx([30.0, 20.0, 10.0])
    assert q_at(TrainConfig(q_start=5.0), 9, 10) == pytest.approx(DEFAULT_Q["l1"])  # toward the default Q
    with pytest.raises(ValueError, match="q_start"):
        TrainConfig(q_start=0.0)


def test_q_schedule_changes_training_and_stays_stack_equal():
    task, X = planted_ir_task(n_docs=120)
    head_cfg = HeadConfig(depth=1, in_dim=16)
    base = TrainConfig(normalize="none", mined_k=0, epochs=2, batch_size=16, q=8.0)
    scheduled = dataclasses.replace(base, q_start=30.0)
    _, _, (fixed,) = train_stack(task, X, head_cfg, [base], progress=False)
    _, _, (sched,) = train_stack(task, X, head_cfg, [scheduled], progress=False)
    assert fixed.history[0]["loss"] != pytest.approx(sched.history[0]["loss"])


def test_selection_scores_equal_the_exact_evaluation():
    """Epoch selection scores every head in one pass, L1 on the 100 nearest documents by L2 (400 documents
    here, so the candidates are a real subset): nDCG@10 equals the exact evaluation's for every head."""
    from headstore.heads.evaluation.evaluate import selection_scores
    from headstore.heads.kinds.ranking import SELECT_CANDIDATES

    task, X = planted_ir_task(n_docs=400)
    head_cfg = HeadConfig(depth=2, hidden=32, out_dim=8, in_dim=16, residual=False)
    base = TrainConfig(normalize="none", impostors="all", mined_k=0, loss="l1-energy", epochs=2, batch_size=16, q=8.0)
    model, norm, _ = train_stack(task, X, head_cfg, [dataclasses.replace(base, seed=s) for s in range(3)],
                                 progress=False)
    embed = embedder(model, norm(X))  # noqa: E731
    assert len(task.eval_sets["test"].doc_rows) > SELECT_CANDIDATES
    exact, _ = evaluate_split(task, "test", embed, ("l1",))
    fast = selection_scores(task, "test", embed, "l1")
    assert fast == pytest.approx([e["manhattan_ndcg@10"] for e in exact], abs=1e-9)
    for precision in ("bf16",):  # bf16 only picks candidates; the kept energies are exact
        assert selection_scores(task, "test", embed, "l1", precision) == pytest.approx(fast, abs=1e-9)


def test_remine_every_below_one_is_refused():
    with pytest.raises(ValueError, match="remine_every"):
        TrainConfig(remine_every=0)
