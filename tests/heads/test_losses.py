import math

import pytest
import torch

from headstore.heads.scoring.losses import LOSSES, LossConfig
from headstore.heads.scoring.losses.settings import COSENT_ENERGY_RANGE

from .test_energy import ref_energy

# ----------------------------------------------------------------- loop references on floats


E_ref = ref_energy  # the loop reference of the energies, shared with test_energy


def impostor_lists(za, zp, zn, energy, same, in_batch):
    """For each anchor i of one head: list of impostor energies (in-batch first, then zn)."""
    B = len(za)
    out = []
    for i in range(B):
        cand = []
        if in_batch:
            cand += [E_ref(energy, za[i], zp[j]) for j in range(B) if j != i and not (same is not None and same[i][j])]
        if zn is not None:
            cand += [E_ref(energy, za[i], zn[i][k]) for k in range(len(zn[i]))]
        out.append(cand)
    return out


def select(cands, e_pos, mode):
    """Selected impostor energies (flat list) under mode."""
    chosen = []
    for i, cand in enumerate(cands):
        if not cand:
            continue
        if mode == "all":
            chosen += cand
        elif mode == "hardest":
            chosen.append(min(cand))
        else:
            farther = [e for e in cand if e > e_pos[i]]
            chosen.append(min(farther) if farther else min(cand))
    return chosen


def ref_pair_impostor(za, zp, zn, labels, energy, same, mode, gw, genuine, impostor):
    B = len(za)
    e_pos = [E_ref(energy, za[i], zp[i]) for i in range(B)]
    if labels is None:
        pair = gw * sum(genuine(e) for e in e_pos) / B
        cands = impostor_lists(za, zp, zn, energy, same, in_batch=True)
    else:
        pair = sum(gw * s * genuine(e) + (1 - s) * impostor(e) for s, e in zip(labels, e_pos)) / B
        if zn is None:
            return pair
        cands = impostor_lists(za, zp, zn, energy, same, in_batch=False)
    chosen = select(cands, e_pos, mode)
    return pair + sum(impostor(e) for e in chosen) / max(len(chosen), 1)


def ref_l1_energy(za, zp, zn, labels, energy, same, cfg, Q):
    return ref_pair_impostor(za, zp, zn, labels, energy, same, cfg.impostors, cfg.genuine_weight,
                             lambda e: 2 / Q * e * e, lambda e: 2 * Q * math.exp(-2.77 * e / Q))


def ref_contrastive(za, zp, zn, labels, energy, same, cfg, m):
    return ref_pair_impostor(za, zp, zn, labels, energy, same, cfg.impostors, cfg.genuine_weight,
                             lambda e: e * e / 2, lambda e: max(0.0, m - e) ** 2 / 2)


def ref_ce(za, zp, zn, same, score):
    """score(a, doc) -> logit; columns: every zp then every zn of every anchor."""
    B = len(za)
    cols = list(zp) + ([n for i in range(B) for n in zn[i]] if zn is not None else [])
    total = 0.0
    for i in range(B):
        logits = [score(za[i], c) for j, c in enumerate(cols) if j == i or j >= B or not (same is not None and same[i][j])]
        own = score(za[i], zp[i])
        total += -own + math.log(sum(math.exp(x) for x in logits))
    return total / B


def ref_cosent(za, zp, labels, energy, lam):
    e = [E_ref(energy, za[i], zp[i]) for i in range(len(za))]
    s = 1.0
    for i in range(len(e)):
        for j in range(len(e)):
            if labels[i] > labels[j]:
                s += math.exp(lam * (e[i] - e[j]))
    return math.log(s)


def ref_triplet(za, zp, zn, energy, same, mode, m):
    B = len(za)
    e_pos = [E_ref(energy, za[i], zp[i]) for i in range(B)]
    vals = []
    for i in range(B):
        if zn is not None:
            cand = [E_ref(energy, za[i], n) for n in zn[i]]
            md = mode
        else:
            cand = [E_ref(energy, za[i], zp[j]) for j in range(B) if j != i and not (same is not None and same[i][j])]
            md = "semi-hard" if mode == "semi-hard" else "hardest"
        vals += [max(0.0, e_pos[i] - e + m) for e in select([cand], [e_pos[i]], md)]
    return sum(vals) / len(vals)


def tolist(x):
    return None if x is None else x.tolist()


def data(H=2, B=4, K=2, d=3, seed=0, labels=None):
    g = torch.Generator().manual_seed(seed)
    za, zp = torch.randn(H, B, d, generator=g), torch.randn(H, B, d, generator=g)
    zn = torch.randn(H, B, K, d, generator=g) if K else None
    return za, zp, zn


# ---------------------------------------------------------------------------- hand values


def test_l1_energy_hand_computed():
    za = torch.tensor([[[0.0], [3.0]]])
    zp = torch.tensor([[[1.0], [3.0]]])
    Q = 4.0
    got = LOSSES["l1-energy"](za, zp, cfg=LossConfig(q=Q))
    # genuine energies 1 and 0; impostors E(a0, p1) = 3, E(a1, p0) = 2
    expected = (2 / Q * 1 + 0) / 2 + (2 * Q * math.exp(-2.77 * 3 / Q) + 2 * Q * math.exp(-2.77 * 2 / Q)) / 2
    assert got.shape == (1,)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_cosent_hand_computed():
    za = torch.tensor([[[0.0], [0.0]]])
    zp = torch.tensor([[[1.0], [3.0]]])  # energies 1 and 3
    got = LOSSES["cosent"](za, zp, labels=torch.tensor([0.2, 0.9]), cfg=LossConfig(scale=0.5))
    lam = 0.5 * 2.0 / COSENT_ENERGY_RANGE["l1"]  # scale rescaled from cosine's range (2) to l1's typical range
    assert got.item() == pytest.approx(math.log(1 + math.exp(lam * (3 - 1))), rel=1e-6)


# ------------------------------------------------------------------- against the references


@pytest.mark.parametrize("energy", ["l1", "l2", "cosine"])
@pytest.mark.parametrize("mode", ["all", "hardest", "semi-hard"])
@pytest.mark.parametrize("with_zn", [False, True])
def test_l1_energy_and_contrastive_unlabelled(energy, mode, with_zn):
    za, zp, zn = data(K=2 if with_zn else 0)
    same = torch.zeros(4, 4, dtype=torch.bool)
    same[0, 2] = same[3, 1] = True
    cfg = LossConfig(q=3.0, margin=2.5, impostors=mode, genuine_weight=0.7)
    got_e = LOSSES["l1-energy"](za, zp, zn, energy=energy, cfg=cfg, same=same)
    got_c = LOSSES["contrastive"](za, zp, zn, energy=energy, cfg=cfg, same=same)
    for h in range(2):
        args = (za[h].tolist(), zp[h].tolist(), tolist(zn[h]) if with_zn else None, None, energy, same.tolist(), cfg)
        assert got_e[h].item() == pytest.approx(ref_l1_energy(*args, Q=3.0), rel=1e-5)
        assert got_c[h].item() == pytest.approx(ref_contrastive(*args, m=2.5), rel=1e-5)


@pytest.mark.parametrize("with_zn", [False, True])
@pytest.mark.parametrize("labels", [[1.0, 0.0, 1.0, 0.0], [0.9, 0.1, 0.5, 0.33]])
def test_labelled_and_graded(with_zn, labels):
    za, zp, zn = data(K=3 if with_zn else 0, seed=3)
    cfg = LossConfig(q=5.0, margin=4.0)
    lab = torch.tensor(labels)
    got_e = LOSSES["l1-energy"](za, zp, zn, lab, cfg=cfg)
    got_c = LOSSES["contrastive"](za, zp, zn, lab, cfg=cfg)
    for h in range(2):
        args = (za[h].tolist(), zp[h].tolist(), tolist(zn[h]) if with_zn else None, labels, "l1", None, cfg)
        assert got_e[h].item() == pytest.approx(ref_l1_energy(*args, Q=5.0), rel=1e-5)
        assert got_c[h].item() == pytest.approx(ref_contrastive(*args, m=4.0), rel=1e-5)


@pytest.mark.parametrize("energy", ["l1", "cosine"])
@pytest.mark.parametrize("with_zn", [False, True])
def test_l1_ce_and_mnr(energy, with_zn):
    za, zp, zn = data(K=2 if with_zn else 0, seed=5)
    same = torch.zeros(4, 4, dtype=torch.bool)
    same[1, 0] = True
    cfg = LossConfig(tau=0.7, scale=20.0)
    got_ce = LOSSES["l1-ce"](za, zp, zn, energy=energy, cfg=cfg, same=same)
    got_mnr = LOSSES["mnr"](za, zp, zn, energy=energy, cfg=cfg, same=same)  # energy ignored
    for h in range(2):
        z = (za[h].tolist(), zp[h].tolist(), tolist(zn[h]) if with_zn else None, same.tolist())
        assert got_ce[h].item() == pytest.approx(ref_ce(*z, lambda a, b: -E_ref(energy, a, b) / 0.7), rel=1e-5)
        assert got_mnr[h].item() == pytest.approx(ref_ce(*z, lambda a, b: 20 * (1 - E_ref("cosine", a, b))), rel=1e-4)


@pytest.mark.parametrize("energy", ["l1", "cosine"])
def test_cosent_reference(energy):
    za, zp, _ = data(B=6, K=0, seed=7)
    labels = [0.1, 0.5, 0.5, 0.9, 0.0, 0.7]  # includes a tie: no term for equal scores
    got = LOSSES["cosent"](za, zp, labels=torch.tensor(labels), energy=energy, cfg=LossConfig(scale=2.0))
    for h in range(2):
        lam = 2.0 * 2.0 / COSENT_ENERGY_RANGE[energy]  # scale per unit of the energy's typical range
        assert got[h].item() == pytest.approx(ref_cosent(za[h].tolist(), zp[h].tolist(), labels, energy, lam), rel=1e-5)


@pytest.mark.parametrize("mode", ["all", "hardest", "semi-hard"])
@pytest.mark.parametrize("with_zn", [False, True])
def test_triplet_reference(mode, with_zn):
    za, zp, zn = data(K=3 if with_zn else 0, seed=9)
    same = torch.zeros(4, 4, dtype=torch.bool)
    same[2, 3] = True
    cfg = LossConfig(margin=1.5, impostors=mode)
    got = LOSSES["triplet"](za, zp, zn, cfg=cfg, same=same)
    for h in range(2):
        ref = ref_triplet(za[h].tolist(), zp[h].tolist(), tolist(zn[h]) if with_zn else None, "l1", same.tolist(), mode, 1.5)
        assert got[h].item() == pytest.approx(ref, rel=1e-5)


# -------------------------------------------------------------------- generic properties


def call(name, za, zp, zn, labels, **kw):
    spec = LOSSES[name]
    if spec.accepts == ("classes",):  # labelled-text losses take label codes: classes 0 0 1 1 0 as one-hot rows
        labels = torch.eye(2)[torch.tensor([0, 0, 1, 1, 0])]
        if spec.outputs == "classes":  # a classifier head outputs one score per class: codes as wide as za
            labels = torch.eye(za.shape[-1])[torch.tensor([0, 0, 1, 1, 0])]
    return spec(za, zp, zn if spec.negatives else None, labels if spec.accepts != ("positives",) else None, **kw)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_shape_gradients_and_multihead_equals_per_head(name):
    za, zp, zn = data(H=3, B=5, K=2, seed=11)
    za.requires_grad_(True)
    labels = torch.tensor([0.0, 0.3, 1.0, 0.6, 0.9])
    loss = call(name, za, zp, zn, labels)
    assert loss.shape == (3,)
    loss.sum().backward()
    assert torch.isfinite(za.grad).all() and za.grad.abs().sum() > 0
    for h in range(3):
        single = call(name, za[h:h + 1], zp[h:h + 1], zn[h:h + 1], labels)
        torch.testing.assert_close(loss[h:h + 1], single)


def test_same_mask_excludes_duplicates():
    """A duplicate positive in the batch must not be pushed away once marked same."""
    _, zp, _ = data(H=1, B=3, K=0)
    zp[0, 1] = zp[0, 0]  # pair 1's positive is the same text as pair 0's
    za = zp + 0.01 * torch.randn(zp.shape, generator=torch.Generator().manual_seed(1))  # positives closest
    same = torch.zeros(3, 3, dtype=torch.bool)
    same[0, 1] = same[1, 0] = True
    for name in ["l1-energy", "contrastive", "l1-ce", "mnr", "triplet"]:
        masked = LOSSES[name](za, zp, cfg=LossConfig(q=3.0, impostors="all"), same=same)
        unmasked = LOSSES[name](za, zp, cfg=LossConfig(q=3.0, impostors="all"))
        assert not torch.allclose(masked, unmasked), name


def test_mnr_is_l1_ce_on_cosine():
    za, zp, zn = data(seed=13)
    a = LOSSES["mnr"](za, zp, zn, cfg=LossConfig(scale=20.0))
    b = LOSSES["l1-ce"](za, zp, zn, energy="cosine", cfg=LossConfig(tau=1 / 20.0))
    torch.testing.assert_close(a, b)


def test_errors():
    za, zp, zn = data(K=2)
    with pytest.raises(ValueError, match="needs labels"):
        LOSSES["cosent"](za, zp)
    with pytest.raises(ValueError, match="positive pairs only"):
        LOSSES["mnr"](za, zp, labels=torch.tensor([1.0, 0.0, 1.0, 1.0]))
    LOSSES["mnr"](za, zp, labels=torch.ones(4))  # all-positive labels are fine
    with pytest.raises(ValueError, match="no negatives"):
        LOSSES["triplet"](za[:, :1], zp[:, :1])
    with pytest.raises(ValueError, match="no impostors"):
        LOSSES["l1-energy"](za[:, :1], zp[:, :1])
    with pytest.raises(ValueError, match="semi-hard"):
        LossConfig(impostors="random")
    with pytest.raises(ValueError, match="cosine"):
        LOSSES["l1-energy"](za, zp, energy="dot")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        LOSSES["l1-energy"](za, zp, labels=torch.tensor([2.0, 0, 0, 1]))
    with pytest.raises(ValueError, match="zn must be"):
        LOSSES["l1-ce"](za, zp, zn[:, :, 0])


def test_cosent_scale_does_not_move_with_l1_energys_q(monkeypatch):
    """CoSENT's lambda has its own constants: retuning l1-energy's default Q leaves CoSENT unchanged."""
    import headstore.heads.scoring.losses.settings as losses

    za, zp, _ = data(B=6, K=0, seed=9)
    labels = torch.tensor([0.1, 0.5, 0.3, 0.9, 0.0, 0.7])
    before = LOSSES["cosent"](za, zp, labels=labels, energy="l1")
    l1e_before = LOSSES["l1-energy"](za, zp, energy="l1")
    monkeypatch.setitem(losses.DEFAULT_Q, "l1", 40.0)
    assert torch.equal(LOSSES["cosent"](za, zp, labels=labels, energy="l1"), before)
    assert not torch.equal(LOSSES["l1-energy"](za, zp, energy="l1"), l1e_before)  # --q / Q: l1-energy only


def test_one_impostor_default():
    from headstore.heads.settings.config import TrainConfig
    from headstore.heads.scoring.losses.settings import DEFAULT_IMPOSTORS

    assert LossConfig().impostors == TrainConfig().impostors == TrainConfig().loss_config().impostors == DEFAULT_IMPOSTORS


# ------------------------------------------------ graded labels and distance-weighted impostors


def ref_pearson_term(e, s):
    n = len(e)
    me, ms = sum(e) / n, sum(s) / n
    cov = sum((a - me) * (b - ms) for a, b in zip(e, s))
    return 1 + cov / math.sqrt(sum((a - me) ** 2 for a in e) * sum((b - ms) ** 2 for b in s))


@pytest.mark.parametrize("graded", ["regress", "pearson"])
@pytest.mark.parametrize("with_zn", [False, True])
def test_graded_modes_against_loops(graded, with_zn):
    za, zp, zn = data(K=2 if with_zn else 0, seed=21)
    labels = [0.9, 0.1, 0.5, 0.3]
    Q, m = 5.0, 4.0
    cfg = LossConfig(q=Q, margin=m, graded=graded, genuine_weight=0.5, impostors="all")
    got_e = LOSSES["l1-energy"](za, zp, zn, torch.tensor(labels), cfg=cfg)
    got_c = LOSSES["contrastive"](za, zp, zn, torch.tensor(labels), cfg=cfg)
    for h in range(2):
        e = [E_ref("l1", za[h][i].tolist(), zp[h][i].tolist()) for i in range(4)]
        negs = [E_ref("l1", za[h][i].tolist(), zn[h][i][k].tolist()) for i in range(4) for k in range(2)] if with_zn else []
        for got, scale, gen, imp in ((got_e, Q, lambda x: 2 / Q * x * x, lambda x: 2 * Q * math.exp(-2.77 * x / Q)),
                                     (got_c, m, lambda x: x * x / 2, lambda x: max(0.0, m - x) ** 2 / 2)):
            if graded == "pearson":
                pair = ref_pearson_term(e, labels)
            else:
                pair = sum(0.5 * gen(x - scale * (1 - s)) for x, s in zip(e, labels)) / 4
            extra = sum(imp(x) for x in negs) / len(negs) if negs else 0.0
            assert got[h].item() == pytest.approx(pair + extra, rel=1e-5)


def test_pearson_term_is_scale_free_and_signed():
    from headstore.heads.scoring.losses.pairs import pearson_term

    s = torch.tensor([0.0, 0.25, 0.5, 1.0])
    perfect = 10 - 7 * s  # energy an exact decreasing affine map of the score
    assert pearson_term(perfect.unsqueeze(0), s).item() == pytest.approx(0.0, abs=1e-6)
    assert pearson_term((3 * perfect + 1).unsqueeze(0), s).item() == pytest.approx(0.0, abs=1e-6)
    assert pearson_term((1 + s).unsqueeze(0), s).item() == pytest.approx(2.0, abs=1e-6)


def ref_distance_weighted(cands_per_anchor, bins):
    """Per anchor: {candidate index: weight}, weight 1/(count of the batch energies in its bin), normalised."""
    flat = [e for c in cands_per_anchor for e in c]
    lo, hi = min(flat), max(flat)
    width = max(hi - lo, 1e-7) / bins
    b = lambda e: min(bins - 1, max(0, int(math.floor((e - lo) / width))))
    counts = {}
    for e in flat:
        counts[b(e)] = counts.get(b(e), 0) + 1
    out = []
    for c in cands_per_anchor:
        w = [1 / counts[b(e)] for e in c]
        out.append([x / sum(w) for x in w] if w else [])
    return out


@pytest.mark.parametrize("with_zn", [False, True])
def test_distance_weighted_impostors_against_loop(with_zn):
    from headstore.heads.scoring.losses.settings import DISTANCE_BINS

    za, zp, zn = data(B=6, K=3 if with_zn else 0, seed=23)
    same = torch.zeros(6, 6, dtype=torch.bool)
    same[0, 3] = True
    Q = 4.0
    cfg = LossConfig(q=Q, impostors="distance-weighted")
    got = LOSSES["l1-energy"](za, zp, zn, cfg=cfg, same=same)
    for h in range(2):
        zs = [x.tolist() for x in (za[h], zp[h])]
        cands = impostor_lists(*zs, tolist(zn[h]) if with_zn else None, "l1", same.tolist(), in_batch=True)
        weights = ref_distance_weighted(cands, DISTANCE_BINS)
        e_pos = [E_ref("l1", zs[0][i], zs[1][i]) for i in range(6)]
        pair = sum(2 / Q * e * e for e in e_pos) / 6
        imp = sum(w * 2 * Q * math.exp(-2.77 * e / Q) for c, ws in zip(cands, weights) for e, w in zip(c, ws)) / 6
        assert got[h].item() == pytest.approx(pair + imp, rel=1e-5)


def test_graded_mode_is_checked():
    with pytest.raises(ValueError, match="pearson"):
        LossConfig(graded="rank")
