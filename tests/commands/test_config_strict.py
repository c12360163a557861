"""Strict configs: an unknown key, also one added with `+key=`, is an error with the closest known key; Hydra's own
keys pass; `model=local` needs `model.path`; bad train settings are named before any worker starts."""

from __future__ import annotations

import pytest

from fastrl.cli import main
from fastrl.commands.generate_config import GenerateConfig
from fastrl.commands.train_config import TrainConfig
from fastrl.commands.train_drafter_config import TrainDrafterConfig
from fastrl.config_compose import check_override_keys, in_schema_words


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
    "command, override, message",
    [
        # a nested key typed without its section: the key as typed, and the whole key meant
        ("train", "engine.admit_batch=4", "no key 'engine.admit_batch'; did you mean 'rollout.engine.admit_batch'?"),
        ("train", "page_size=4", "no key 'page_size'; did you mean 'rollout.engine.page_size'?"),
        # a section misspelt: the suggestion keeps the rest of the key
        ("train-drafter", "drafter_trainer.lr=1e-4", "no key 'drafter_trainer.lr'; did you mean 'trainer.lr'?"),
        ("train-drafter", "trainr.ttt_steps=2", "no key 'trainr.ttt_steps'; did you mean 'trainer.ttt_steps'?"),
        ("generate", "bandt.epsilon=0.1", "no key 'bandt.epsilon'; did you mean 'bandit.epsilon'?"),
    ],
)
def test_an_unknown_key_is_quoted_as_typed(command, override, message, capsys):
    """The CLI's errors put a nested config's own key names in the user's words; an unknown key is the user's
    words already, and rewriting it (``engine.x`` -> ``rollout.engine.x``) named a key that exists as unknown."""
    assert main([command, override]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["model=local"], "model=local needs model.path=DIR"),
        (["model.path=/nonexistent"], "model.path=/nonexistent: checkpoint directory /nonexistent does not exist"),
        (["threads=-1"], "threads must be >= 1"),
        (["drafter.path=/nonexistent"], "drafter.path=/nonexistent: drafter directory /nonexistent does not exist"),
        (
            ["rollout.engine.dtype=int8"],
            "rollout.engine.dtype must be one of ['bfloat16', 'float16', 'float32', 'float64'], got 'int8'",
        ),
    ],
)
def test_train_bad_settings_are_named(tmp_path, args, message, capsys):
    assert main(["train", *args, "rollout=local", "logger=none", f"hydra.run.dir={tmp_path}"]) == 2
    assert message in capsys.readouterr().err


def test_nested_configs_own_key_names_become_the_keys_as_typed():
    """A nested config names its keys by its class (BanditConfig.epsilon) or its own short prefix (engine.,
    drafter_trainer.); each command's errors name them as the user types them, wherever the config sits."""
    assert in_schema_words("BanditConfig.epsilon is bad", GenerateConfig) == "bandit.epsilon is bad"
    assert in_schema_words("BanditConfig.epsilon bad", TrainConfig) == "strategy.bandit.epsilon bad"
    assert in_schema_words("engine.page_size must be >= 1", TrainConfig) == "rollout.engine.page_size must be >= 1"
    assert in_schema_words("drafter_trainer.lr must be > 0", TrainConfig) == "drafter.trainer.lr must be > 0"
    assert in_schema_words("drafter_trainer.lr must be > 0", TrainDrafterConfig) == "trainer.lr must be > 0"
    assert in_schema_words("GRPOConfig.steps and EmaConfig.alpha", TrainConfig) == "rl.steps and strategy.ema.alpha"
    # only where the name starts a key; text that is no key name stays
    untouched = "rollout.engine.page_size=0 (see EngineConfig), a BanditConfig, xengine.page_size"
    assert in_schema_words(untouched, TrainConfig) == untouched
    assert in_schema_words("engine.page_size", GenerateConfig) == "engine.page_size"  # no engine section there


@pytest.mark.parametrize(
    "command, args, message",
    [
        ("generate", ["bandit.epsilon=-1"], "error: bandit.epsilon must be in [0, 1], got -1.0"),
        ("generate", ["bandit.strategies=3_1_4"], "; bandit.strategies takes a list: bandit.strategies=[3_1_4]"),
        ("generate", ["strategy.name=bandit"], "; strategy holds one value, not keys below it: strategy=VALUE"),
        ("generate", ["bandit.prior_rows=inf"], "error: bandit.prior_rows must be a finite number >= 0, got inf"),
        ("generate", ["bandit.explore_budget=inf"], "error: bandit.explore_budget must be None or a finite number"),
        ("generate", ["bandit.decide_every_s=inf"], "error: bandit.decide_every_s must be a finite number >= 0"),
        ("check-exact", ["strategy=bandit", "bandit.min_pulls=-1"], "error: bandit.min_pulls must be an integer"),
        ("generate", ["strategy=ema", "ema.candidate_steps=[]"], "error: ema.candidate_steps must be a non-empty"),
        ("train-drafter", ["trainer.lr=-1"], "error: trainer.lr must be a finite number > 0, got -1.0"),
        (
            "train",
            ["drafter.trainer.lr=-1", "logger=none"],
            "error: drafter.trainer.lr must be a finite number > 0, got -1.0",
        ),
        ("train-drafter", ["trainer.grad_clip=0"], "error: trainer.grad_clip must be a finite number > 0, got 0.0"),
        ("train-drafter", ["trainer.weight_decay=-1"], "error: trainer.weight_decay must be a finite number >= 0"),
        ("train-drafter", ["trainer.feature_noise=-1"], "error: trainer.feature_noise must be a finite number >= 0"),
        ("train-drafter", ["threads=-1"], "error: train_drafter.threads must be >= 0"),
        ("train-drafter", ["device=gpu"], "error: train_drafter.device='gpu' is not a torch device"),
        ("train-drafter", ["stream_dir=/proc/fastrl-nope"], "error: stream_dir=/proc/fastrl-nope: cannot create"),
    ],
)
def test_every_command_names_nested_keys_as_typed(tmp_path, command, args, message, capsys):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "1+2="}\n')
    extra = {"generate": [f"prompts={prompts}"], "check-exact": [f"prompts={prompts}"]}.get(command, [])
    extra += [f"hydra.run.dir={tmp_path / 'run'}"] if command == "train" else []
    assert main([command, *args, *extra]) == 2
    assert message in capsys.readouterr().err
