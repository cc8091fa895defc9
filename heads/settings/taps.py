"""The settings of `cli select-taps` (heads.training.tap_select): a small frozen dataclass, torch-free so the
command line can read its defaults without loading torch."""
from __future__ import annotations

from dataclasses import dataclass

from headstore.data.errors import SettingError


@dataclass(frozen=True)
class TapSelectConfig:
    penalty: float = 0.1  # group-lasso strength (per proximal step): on a planted toy (tests) 0.1 zeroes or nearly
    # zeroes the noise groups, 7-20x below the informative one; 0.01 leaves them half as large as it
    rank: int = 16  # the linear map's width: the ranking needs directions, not a good head (64 and 10 epochs took
    # 14 min on STS-B's 18 taps on a loaded 2-core CPU; 16 and 5 epochs are ~8x cheaper)
    epochs: int = 5  # passes over the training pairs
    lr: float = 0.1  # SGD's step (momentum 0.9): Adam moves every weight at its own ~lr whatever its gradient's
    # size, so noise groups grew as fast as the informative one on the toy
    batch_size: int = 256  # pairs per step
    keep: int = 4  # taps the head reads beside `features`
    seed: int = 0  # initialisation, batch order, the shuffled partners of positive pairs

    def __post_init__(self):
        for name, holds, what in (("penalty", self.penalty >= 0, ">= 0"), ("rank", self.rank >= 1, ">= 1"),
                                  ("epochs", self.epochs >= 1, ">= 1"), ("lr", self.lr > 0, "> 0"),
                                  ("batch_size", self.batch_size >= 1, ">= 1"), ("keep", self.keep >= 1, ">= 1")):
            if not holds:
                raise SettingError(name, f"must be {what}, got {getattr(self, name)}")
