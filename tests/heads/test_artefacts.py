"""heads.artefacts.files: a head directory written by `write_head_dir` reads back as it was; a partial one is named."""
from dataclasses import asdict

import pytest
import torch

from headstore.heads.artefacts.files import CONFIG_FILE, HEAD_FILE, NORMALIZER_FILE, read_head_dir, write_head_dir
from headstore.heads.settings.config import TrainConfig
from headstore.heads.network.features import Normalizer
from headstore.heads.network.model import HeadConfig, StackedMLP


def _head(seed: int = 0):
    model = StackedMLP(1, HeadConfig(depth=2, hidden=8, in_dim=6, residual=False), seeds=[seed])
    norm = Normalizer.fit("standardize", torch.randn(20, 6, generator=torch.Generator().manual_seed(seed)))
    config = {"head": asdict(model.cfg), "train": TrainConfig(lr=1e-3).to_dict(), "store_manifest": {"dim": 6},
              "store_fingerprint": "f" * 64, "array": "features", "data": "somewhere"}
    return model, norm, config


def test_head_dir_round_trips_weights_normaliser_and_config(tmp_path):
    model, norm, config = _head()
    d = write_head_dir(tmp_path / "h", model, norm, config)
    assert {p.name for p in d.iterdir()} == {HEAD_FILE, NORMALIZER_FILE, CONFIG_FILE}
    model2, norm2, config2 = read_head_dir(d)
    assert model2.cfg == model.cfg and model2.seeds == model.seeds
    for (k, v), (k2, v2) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    assert (norm2.kind, norm2.blocks) == (norm.kind, norm.blocks)
    assert torch.equal(norm2.center, norm.center) and torch.equal(norm2.scale, norm.scale)
    assert config2 == config


def test_config_without_weights_is_an_incomplete_head_dir(tmp_path):
    d = write_head_dir(tmp_path / "h", *_head())
    (d / HEAD_FILE).unlink()  # what a write stopped before its last file (the weights) leaves
    with pytest.raises(FileNotFoundError, match="incomplete head directory"):
        read_head_dir(d)


def test_a_head_dir_without_normaliser_reads_with_the_identity(tmp_path):
    d = write_head_dir(tmp_path / "h", *_head())
    (d / NORMALIZER_FILE).unlink()  # heads saved before normalisers were
    _, norm, _ = read_head_dir(d)
    x = torch.randn(3, 6)
    assert norm.kind == "none" and torch.equal(norm(x), x)
