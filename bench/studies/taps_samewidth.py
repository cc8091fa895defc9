"""A study prototype, not the product (issue 57): `cli` with a residual head allowed over arrays of one width read
side by side (`--mix-mode concat`, e.g. `features+tap_block_1+...+tap_block_5`). The model's forward already adds
back the leading out_dim columns (the first array, as for taps of several widths); only the build check
(heads.network.model._check_buildable) refuses it. `allow()` lifts that refusal in the process (taps_fusion.py
--same-width-residual calls it, to score such heads).

    python3 bench/studies/taps_samewidth.py train-head --store S --data ../shared/datasets/stsb --out H \\
        --array features+tap_block_1+tap_block_2+tap_block_3+tap_block_4+tap_block_5 --mix-mode concat \\
        --normalize standardize --out-dim 384 --array-dropout 0.3 --lr 3e-4
"""
import dataclasses
import sys

from headstore.heads.network import model


def same_width_residual(check):
    """The build check `check`, but a residual head over same-width arrays side by side passes (out_dim = one
    array's width: it adds back the first array)."""
    def checked(cfg) -> None:
        if cfg.mix_mode == "concat" and cfg.mix > 1 and cfg.residual and cfg.depth > 0:
            if cfg.out_features != cfg.in_dim:
                raise ValueError(f"out_dim {cfg.out_features}: a same-width residual adds back the first array "
                                 f"({cfg.in_dim} wide)")
            return check(dataclasses.replace(cfg, residual=False))
        return check(cfg)
    return checked


def allow() -> None:
    """Lift the refusal in this process (heads built from now on, trained or loaded)."""
    model._check_buildable = same_width_residual(model._check_buildable)


if __name__ == "__main__":
    from headstore.cli import main
    allow()
    sys.argv = ["cli", *sys.argv[1:]]
    main()
