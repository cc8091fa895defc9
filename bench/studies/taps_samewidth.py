"""A study prototype, not the product (issue 57): `cli` with a residual head allowed over arrays of one width read
side by side (`--mix-mode concat`, e.g. `features+tap_block_1+...+tap_block_5`). The model's forward already adds
back the leading out_dim columns (the first array, as for taps of several widths); only the build check
(heads.network.model._check_buildable) refuses it. Importing this module lifts that refusal in this process
(taps_fusion.py --same-width-residual does, to score such heads).

    python3 bench/studies/taps_samewidth.py train-head --store S --data ../shared/datasets/stsb --out H \\
        --array features+tap_block_1+tap_block_2+tap_block_3+tap_block_4+tap_block_5 --mix-mode concat \\
        --normalize standardize --out-dim 384 --array-dropout 0.3 --lr 3e-4
"""
import dataclasses
import sys

from headstore.heads.network import model

_check = model._check_buildable


def _check_same_width_residual(cfg) -> None:
    if cfg.mix_mode == "concat" and cfg.mix > 1 and cfg.residual and cfg.depth > 0:
        assert cfg.out_features == cfg.in_dim, "the prototype adds back the first array only"
        return _check(dataclasses.replace(cfg, residual=False))
    return _check(cfg)


model._check_buildable = _check_same_width_residual

if __name__ == "__main__":
    from headstore.cli import main
    sys.argv = ["cli", *sys.argv[1:]]
    main()
