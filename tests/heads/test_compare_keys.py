"""cli compare's step keys hold the settings that differ from their defaults: a setting added to the code later
(at its default) keeps every finished step of a table that runs over several sessions, while any setting the run
changes is in the key."""
import dataclasses

from headstore.heads.apply.finetune import FinetuneConfig
from headstore.heads.experiments.compare_setups import changed_settings
from headstore.heads.settings.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class Old:
    lr: float = 1e-3
    epochs: int = 10


@dataclasses.dataclass(frozen=True)
class New(Old):  # the same settings and one added later, at its default
    label_smoothing: float = 0.1


def test_a_setting_added_at_its_default_keeps_the_key():
    assert changed_settings(Old(lr=3e-3)) == changed_settings(New(lr=3e-3)) == {"lr": 3e-3}
    assert changed_settings(New(lr=3e-3, label_smoothing=0.2)) == {"lr": 3e-3, "label_smoothing": 0.2}
    assert changed_settings(Old()) == {}


def test_train_config_keys_are_flat_and_hold_each_change():
    base = changed_settings(TrainConfig())
    assert base == {}
    changed = changed_settings(TrainConfig().replace(seed=2, mined_k=3))
    assert changed == {k: v for k, v in TrainConfig().replace(seed=2, mined_k=3).to_dict().items()
                       if v != TrainConfig().to_dict()[k]}
    assert changed["seed"] == 2 and changed["mined_k"] == 3


def test_finetune_keys_tell_setups_and_learning_rates_apart():
    keys = {str(changed_settings(FinetuneConfig(setup=s, encoder_lr=lr)))
            for s in ("full", "adapters", "lora") for lr in (1e-5, 2e-5)}
    assert len(keys) == 6
