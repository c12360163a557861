"""Strict configs: an unknown key, also one added with `+key=`, is an error with the closest known key; Hydra's own
keys pass; `model=local` needs `model.path`; bad train settings are named before any worker starts."""

from __future__ import annotations

import pytest

from fastrl.cli import main
from fastrl.commands.generate_config import GenerateConfig
from fastrl.commands.train_config import TrainConfig
from fastrl.config_compose import check_override_keys


@pytest.mark.parametrize(
    "override, message",
    [
        ("+temperture=0", "no key 'temperture'; did you mean 'temperature'?"),
        ("++temperture=0", "no key 'temperture'; did you mean 'temperature'?"),
        ("bandit.epsilonn=0.2", "no key 'bandit.epsilonn'; did you mean 'bandit.epsilon'?"),
        ("+zzz=1", "no key 'zzz'; top-level keys are ["),
        ("ema.candidate_steps.x=1", None),  # inside a list-valued key: Hydra's business
    ],
)
def test_generate_keys(override, message):
    if message is None:
        check_override_keys("generate", GenerateConfig, [override])
        return
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("?", r"\?")):
        check_override_keys("generate", GenerateConfig, [override])


def test_train_keys_and_hydra_flags():
    check_override_keys("train", TrainConfig, ["-m", "hydra.run.dir=x", "rl.lr=1e-3", "model=local", "+model.path=p"])
    with pytest.raises(ValueError, match="did you mean 'rollout.num_workers'"):
        check_override_keys("train", TrainConfig, ["+rollout.numworkers=3"])


def test_train_unknown_key_exits_with_a_clear_error(capsys):
    assert main(["train", "+rl.lrr=1"]) == 2
    assert "no key 'rl.lrr'; did you mean 'rl.lr'?" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["model=local"], "model=local needs model.path=DIR"),
        (["model.path=/nonexistent"], "model.path=/nonexistent: checkpoint directory /nonexistent does not exist"),
        (["threads=-1"], "threads must be >= 1"),
        (["drafter.path=/nonexistent"], "drafter.path=/nonexistent: drafter directory /nonexistent does not exist"),
        (
            ["rollout.engine.dtype=int8"],
            "engine.dtype must be one of ['bfloat16', 'float16', 'float32', 'float64'], got 'int8'",
        ),
    ],
)
def test_train_bad_settings_are_named(tmp_path, args, message, capsys):
    assert main(["train", *args, "rollout=local", "logger=none", f"hydra.run.dir={tmp_path}"]) == 2
    assert message in capsys.readouterr().err
