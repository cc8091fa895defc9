import pytest
import torch

from headstore.featurize.encoder.pooling import POOLINGS, cls_pool, max_pool, mean_pool


@pytest.fixture
def batch():
    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 4)  # (B, S, D)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    hidden[mask == 0] = 100.0  # padding holds large values: any leak shows
    return hidden, mask


def test_mean_pool_matches_hand_computation(batch):
    hidden, mask = batch
    got = mean_pool(hidden, mask)
    for b in range(3):
        n = int(mask[b].sum())
        expected = sum(hidden[b, s] for s in range(n)) / n
        torch.testing.assert_close(got[b], expected)


def test_cls_pool_is_first_token(batch):
    hidden, mask = batch
    torch.testing.assert_close(cls_pool(hidden, mask), hidden[:, 0])


def test_max_pool_ignores_padding(batch):
    hidden, mask = batch
    got = max_pool(hidden, mask)
    for b in range(3):
        n = int(mask[b].sum())
        for d in range(4):
            assert got[b, d] == max(hidden[b, s, d] for s in range(n))
    assert (got < 100).all()


def test_max_pool_padding_never_wins_even_when_real_values_are_very_negative():
    hidden = torch.full((1, 3, 2), -1e30)
    hidden[0, 2] = 0.0  # padding position with a larger value
    got = max_pool(hidden, torch.tensor([[1, 1, 0]]))
    assert (got == -1e30).all()


def test_poolings_are_float32_under_half_inputs(batch):
    hidden, mask = batch
    for pool in POOLINGS.values():
        assert pool(hidden.to(torch.bfloat16), mask).dtype == torch.float32


def test_registry_names():
    from headstore.featurize.encoder.config import POOLING_NAMES
    from headstore.featurize.encoder.sentence import POOLING_MODES

    assert set(POOLINGS) == set(POOLING_MODES)  # every sentence-transformers Pooling mode
    assert set(POOLING_NAMES) == {"mean", "cls", "max", "model"}  # --pooling: the model's own, or an override
