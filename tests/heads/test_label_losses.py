"""Label losses against hand computations: Y Yᵀ targets, supcon-kl's KL, supcon, the label-pair energy loss."""
import math

import numpy as np
import pytest
import torch

from headstore.heads.scoring.losses.classes import label_similarity, label_energy_loss, supcon_kl_loss, supcon_loss
from headstore.heads.scoring.losses import LOSSES, LossConfig


def _one_hot(classes, n):
    return torch.eye(n)[torch.as_tensor(classes)]


def test_targets_are_y_y_transpose():
    Y = _one_hot([0, 1, 0, 2], 3)
    S = label_similarity(Y)[0]
    expected = torch.tensor([[1., 0, 1, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]])
    assert torch.equal(S, expected)


def _kl_by_hand(z, classes, tau):
    """Loop form of the note's loss: KL(T_i || softmax_j(-|z_i - z_j|_1 / tau)) over j != i."""
    B = len(classes)
    total, anchors = 0.0, 0
    for i in range(B):
        others = [j for j in range(B) if j != i]
        logits = [-sum(abs(a - b) for a, b in zip(z[i], z[j])) / tau for j in others]
        m = max(logits)
        log_z = m + math.log(sum(math.exp(x - m) for x in logits))
        positives = [j for j in others if classes[j] == classes[i]]
        if not positives:
            continue
        t = 1.0 / len(positives)  # the row-normalised Y Yᵀ without the diagonal
        total += sum(t * (math.log(t) - (logits[others.index(j)] - log_z)) for j in positives)
        anchors += 1
    return total / anchors


def test_supcon_kl_matches_a_hand_computation():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(6, 3))
    classes = [0, 0, 1, 1, 1, 2]  # class 2 has no partner: left out
    za = torch.tensor(z, dtype=torch.float64).unsqueeze(0)
    loss = supcon_kl_loss(za, za, labels=_one_hot(classes, 3).double(), energy="l1", cfg=LossConfig(tau=0.7))
    assert loss.shape == (1,)
    assert loss.item() == pytest.approx(_kl_by_hand(z.tolist(), classes, 0.7), rel=1e-10)


def test_supcon_matches_khosla_by_hand_and_differs_from_kl_by_the_entropy():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(5, 4))
    classes = [0, 1, 0, 1, 0]
    u = z / np.linalg.norm(z, axis=1, keepdims=True)
    by_hand = []
    for i in range(5):
        others = [j for j in range(5) if j != i]
        log_den = math.log(sum(math.exp(u[i] @ u[j] / 0.1) for j in others))
        pos = [j for j in others if classes[j] == classes[i]]
        by_hand.append(-sum(u[i] @ u[p] / 0.1 - log_den for p in pos) / len(pos))
    za = torch.tensor(z).unsqueeze(0)
    Y = _one_hot(classes, 2).double()
    sup = supcon_loss(za, za, labels=Y, cfg=LossConfig())
    assert sup.item() == pytest.approx(np.mean(by_hand), rel=1e-10)
    # KL = CE - H(T): supcon-kl under cosine energy with the same tau is supcon minus the mean target entropy
    kl = supcon_kl_loss(za, za, labels=Y, energy="cosine", cfg=LossConfig(tau=0.1))
    entropy = np.mean([math.log(2 if c == 0 else 1) for c in classes])  # class 0 rows: 2 partners, class 1: 1
    assert kl.item() == pytest.approx(sup.item() - entropy, rel=1e-9)


def test_hierarchical_targets_on_a_tiny_tree():
    """comp.sys.mac, comp.sys.ibm, comp.graphics, rec.autos under a 3-level tree (codes as heads.label_tasks builds)."""
    from headstore.heads.kinds.labels import LabelSplit, LabelTask

    leaf_nodes = np.array([[0, 0, 0], [0, 0, 1], [0, 1, 2], [1, 2, 3]])  # level1 comp/rec, level2, leaf
    task = LabelTask("tree", "labels", None, {}, class_names=("mac", "ibm", "graphics", "autos"),
                     level_names=("level1", "level2", "label"),
                     node_names=(("comp", "rec"), ("comp.sys", "comp.graphics", "rec.autos"), ("a", "b", "c", "d")),
                     leaf_nodes=leaf_nodes)
    split = LabelSplit(np.arange(4), np.arange(4), leaf_nodes)
    S = label_similarity(torch.tensor(task.codes(split, hierarchy=True)))[0]
    expected = torch.tensor([[1, 2 / 3, 1 / 3, 0], [2 / 3, 1, 1 / 3, 0], [1 / 3, 1 / 3, 1, 0], [0, 0, 0, 1]])
    assert torch.allclose(S, expected, atol=1e-6)
    assert torch.equal(label_similarity(torch.tensor(task.codes(split, hierarchy=False)))[0], torch.eye(4))
    # the KL target of an anchor spreads over its relatives in proportion to the shared depth
    z = torch.randn(1, 4, 3, dtype=torch.float64)
    Y = torch.tensor(task.codes(split, hierarchy=True), dtype=torch.float64)
    logits = -torch.cdist(z[0], z[0], p=1)
    T = (S.double() * (1 - torch.eye(4, dtype=torch.float64)))
    T = T[:3] / T[:3].sum(1, keepdim=True)  # rec.autos has no relative: left out
    mask = ~torch.eye(4, dtype=torch.bool)[:3]
    logp = torch.log_softmax(logits[:3].masked_fill(~mask, float("-inf")), dim=1)
    expected_kl = torch.where(T > 0, T * (torch.log(T.clamp_min(1e-30)) - logp.masked_fill(~mask, 0)), 0).sum(1).mean()
    assert supcon_kl_loss(z, z, labels=Y, energy="l1", cfg=LossConfig(tau=1.0)).item() == pytest.approx(expected_kl.item())


def test_label_energy_loss_matches_a_loop_and_is_l1_energys_class_form():
    rng = np.random.default_rng(2)
    z = rng.normal(size=(5, 3))
    classes = [0, 0, 1, 1, 2]
    Q = 4.0
    gen, imp = [], []
    for i in range(5):
        for j in range(5):
            if i != j:
                e = float(np.abs(z[i] - z[j]).sum())
                (gen if classes[i] == classes[j] else imp).append((e))
    expected = np.mean([(2 / Q) * e ** 2 for e in gen]) + np.mean([2 * Q * math.exp(-2.77 * e / Q) for e in imp])
    za = torch.tensor(z).unsqueeze(0)
    Y = _one_hot(classes, 3).double().unsqueeze(0)  # (H, B, L): label codes
    cfg = LossConfig(q=Q, impostors="all")
    assert label_energy_loss(za, za, labels=Y, cfg=cfg).item() == pytest.approx(expected, rel=1e-10)
    assert LOSSES["l1-energy"].function("classes")(za, za, labels=Y, cfg=cfg).item() == pytest.approx(expected, rel=1e-10)
    hardest = label_energy_loss(za, za, labels=Y, cfg=LossConfig(q=Q, impostors="hardest"))
    assert hardest.item() > label_energy_loss(za, za, labels=Y, cfg=cfg).item()  # hardest impostors weigh more


def test_same_mask_and_bad_inputs():
    z = torch.randn(2, 4, 3)
    Y = _one_hot([0, 0, 1, 1], 2)
    same = torch.zeros(4, 4, dtype=torch.bool)
    same[0, 1] = same[1, 0] = True  # rows 0 and 1 are the same text: never compared
    loss = supcon_kl_loss(z, z, labels=Y, same=same)
    assert loss.shape == (2,) and torch.isfinite(loss).all()
    with pytest.raises(ValueError, match="needs label codes"):
        supcon_loss(z, z)
    with pytest.raises(ValueError, match="label codes"):
        supcon_kl_loss(z, z, labels=torch.ones(3, 2))
    with pytest.raises(ValueError, match="no impostor"):
        label_energy_loss(z, z, labels=_one_hot([0, 0, 0, 0], 1))
    assert {"supcon-kl", "supcon"} <= set(LOSSES)


def test_gradients_pull_classes_together():
    torch.manual_seed(0)
    z = torch.randn(1, 8, 4, requires_grad=True)
    Y = _one_hot([0, 0, 1, 1, 2, 2, 3, 3], 4)
    opt = torch.optim.SGD([z], lr=0.1)
    first = None
    for _ in range(100):
        loss = supcon_kl_loss(z, z, labels=Y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.sum().backward()
        opt.step()
    assert loss.item() < 0.5 * first
