"""Selection before width (heads.training.tap_select): the group lasso, run on the training pairs alone, picks the
one array a planted similarity lives in, among arrays of noise of several widths."""
from __future__ import annotations

import numpy as np
import pytest

from headstore.data.errors import SettingError
from headstore.heads.settings.taps import TapSelectConfig
from headstore.heads.training.tap_select import check_fit, chosen_spec, group_scores, pair_targets


def planted(n_texts=400, n_pairs=1500, informative=2, widths=(16, 64, 16, 64, 16), seed=0):
    """Arrays of noise; in array `informative` the first 4 columns hold a text's latent vector, and a pair's target
    is the cosine of its texts' latent vectors mapped to [0, 1]."""
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n_texts, 4))
    blocks = [rng.normal(size=(n_texts, w)).astype(np.float32) for w in widths]
    blocks[informative][:, :4] = latent
    a, b = rng.integers(0, n_texts, n_pairs), rng.integers(0, n_texts, n_pairs)
    cos = (latent[a] * latent[b]).sum(1) / np.linalg.norm(latent[a], axis=1) / np.linalg.norm(latent[b], axis=1)
    return blocks, a, b, ((cos + 1) / 2).astype(np.float32)


@pytest.mark.parametrize("informative", [1, 2])
def test_group_lasso_picks_the_planted_tap(informative):
    blocks, a, b, y = planted(informative=informative)
    scores, fit = group_scores(blocks, a, b, y, TapSelectConfig(epochs=15, rank=16))
    check_fit(scores, fit, 0.1)  # a fit that rises: no error
    assert int(np.argmax(scores)) == informative
    others = np.delete(scores, informative)
    assert scores[informative] > 3 * others.max(), scores  # clearly apart, not a near tie
    names = [f"tap_{i}" for i in range(len(blocks))]
    assert chosen_spec("features", names, scores, keep=1) == f"features+tap_{informative}"


def test_the_penalty_zeroes_the_noise_groups():
    blocks, a, b, y = planted(informative=2)
    scores, _ = group_scores(blocks, a, b, y, TapSelectConfig(epochs=15, rank=16, penalty=0.3))
    assert scores[2] > 0 and (np.delete(scores, 2) == 0).all(), scores
    assert chosen_spec("features", [f"t{i}" for i in range(5)], scores, keep=3) == "features+t2"  # zeros never kept


def test_positive_pairs_get_shuffled_partners_as_zeros():
    a, p = np.arange(5), np.arange(5, 10)
    anchors, partners, y = pair_targets(a, p, None, seed=0)
    assert list(anchors) == [*a, *a] and list(partners[:5]) == list(p) and sorted(partners[5:]) == list(p)
    assert list(y) == [1] * 5 + [0] * 5


def test_bad_settings_name_the_setting():
    with pytest.raises(SettingError, match="keep"):
        TapSelectConfig(keep=0)


def test_a_fit_that_falls_or_overflows_is_refused_naming_the_step():
    """The group lasso's check: the training pairs' Pearson must end above where it began, every score finite (the
    divergence seen on 35 heavy-tailed STS-B taps at --lr 0.1: 0.219, 0.141, 0.141, 0.135, 0.135)."""
    check_fit(np.ones(3), [0.31, 0.45, 0.73], 0.1)
    check_fit(np.ones(3), [0.5], 0.1)  # one epoch: nothing to compare
    with pytest.raises(ValueError, match=r"--lr 0.1 .*0.219, 0.141.*smaller --lr \(e.g. 0.01\)"):
        check_fit(np.ones(3), [0.219, 0.141, 0.141, 0.135, 0.135], 0.1)
    with pytest.raises(ValueError, match="did not fit"):
        check_fit(np.array([1.0, np.inf]), [0.1, 0.5], 1.0)
