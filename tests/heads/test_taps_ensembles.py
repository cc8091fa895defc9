"""The taps ensembles study (bench/studies/taps_ensembles.py): a unit's values are the mean L1 energy of its heads,
as the product's EnsembleHead scores the same heads (the independent reference), and a rerun reads the cache."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from headstore.featurize.store.reader import FeatureStore
from headstore.heads.artefacts.head import EnsembleHead, Head
from headstore.heads.settings.config import HeadConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies"))
taps_ensembles = pytest.importorskip("taps_ensembles")


def test_a_units_values_are_its_heads_mean_l1_energy_as_the_product_ensemble_scores_it(world, tmp_path):
    dirs = [world.random_head(f"ens-unit-{i}", HeadConfig(hidden=16, depth=1 + i), "l2", seed=i) for i in range(3)]
    store = FeatureStore.open(world.store)
    pairs = SimpleNamespace(anchor=np.array([0, 1, 2, 3, 4]), positive=np.array([5, 3, 7, 1, 0]))
    a = SimpleNamespace(cache=str(tmp_path / "vals"))
    Path(a.cache).mkdir()
    got = taps_ensembles.unit_values(a, [dirs[:2], dirs], "dev", store, pairs)  # two units: 2 heads and 3 heads
    assert got.shape == (2, 5)
    for row, unit in zip(got, (dirs[:2], dirs)):
        ens = EnsembleHead([Head.load(d) for d in unit])
        x = lambda rows: store.features(rows, "features")  # noqa: E731
        want = -np.diag(ens.energy(x(pairs.anchor), x(pairs.positive)))  # the pairs' own energies
        np.testing.assert_allclose(row, want, rtol=1e-5, atol=1e-4)
    assert len(list(Path(a.cache).iterdir())) == 3  # one file a head and split, shared by the units
    np.testing.assert_array_equal(taps_ensembles.unit_values(a, [dirs[:2], dirs], "dev", store, pairs), got)
