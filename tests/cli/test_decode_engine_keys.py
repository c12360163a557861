"""The decoding commands' `engine` section: every engine setting reaches the engine (`fastrl generate` and
`fastrl check-exact`), none changes a token, the keys the commands set themselves are refused naming theirs, and the
shipped YAML's defaults are `EngineConfig`'s."""

from __future__ import annotations

import json
import random

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from fastrl.cli import main
from fastrl.commands.check_exact_config import CheckExactConfig
from fastrl.commands.decode_config import ENGINE_KEYS_SET_ELSEWHERE
from fastrl.commands.generate_config import GenerateConfig
from fastrl.config_compose import conf_dir
from fastrl.engine.config import EngineConfig

BASE = ["max_new_tokens=12", "n=2", "batch_size=3", "dtype=float64", "progress=false", "strategy=3_1_4+suffix_8"]
"""Sampled GRPO pairs through the bundled model's drafter and history index, in float64 (no rounding flips)."""


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{a}+{b}*{c}="}) + "\n" for a, b, c in [(12, 34, 5), (7, 81, 3)]))
    return path


def _tokens(path):
    return [json.loads(line)["token_ids"] for line in path.read_text().splitlines()]


def _random_engine_keys(rng: random.Random) -> list[str]:
    """Engine settings drawn at random, each a value the engine accepts for this run: a request's context is 22
    positions and a round adds up to 8, so a pool of 32 tokens holds one request at any page size up to 8, and
    pools below ~72 hold fewer than the batch's three (requests wait or are preempted); a backlog below a round's
    entries is raised to them."""
    return [
        f"engine.page_size={rng.randint(1, 8)}",
        f"engine.drafter_backlog={rng.choice(['null', rng.randint(1, 20)])}",
        f"engine.kv_cache_tokens={rng.choice(['null', rng.randint(32, 72)])}",
        f"engine.prefix_sharing={rng.choice(['true', 'false'])}",
        f"engine.attention_kernel={rng.choice(['true', 'false'])}",
        f"engine.admit_batch={rng.choice(['null', rng.randint(1, 4)])}",
        f"engine.history_tokens={rng.choice([200_000, rng.randint(40, 400)])}",
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_engine_settings_change_no_token(prompts, tmp_path, seed):
    reference = tmp_path / "default.jsonl"
    assert main(["generate", f"prompts={prompts}", f"output={reference}", *BASE]) == 0
    out = tmp_path / "set.jsonl"
    keys = _random_engine_keys(random.Random(seed))
    assert main(["generate", f"prompts={prompts}", f"output={out}", *BASE, *keys]) == 0, keys
    assert _tokens(out) == _tokens(reference), keys


def test_engine_settings_reach_the_engine(prompts, tmp_path, capsys):
    """A pool too small for one request is the engine's own refusal: the key went through to it."""
    args = [f"prompts={prompts}", *BASE, "engine.kv_cache_tokens=8"]
    assert main(["generate", *args, f"output={tmp_path / 'o.jsonl'}"]) == 2
    assert "engine.kv_cache_tokens = 8 cannot hold one request" in capsys.readouterr().err
    assert main(["check-exact", *args]) == 2
    assert "engine.kv_cache_tokens = 8 cannot hold one request" in capsys.readouterr().err
    assert main(["check-exact", *args[:-1], "engine.page_size=3", "engine.drafter_backlog=13"]) == 0
    assert "0 bugs" in capsys.readouterr().out


@pytest.mark.parametrize("key", sorted(ENGINE_KEYS_SET_ELSEWHERE))
@pytest.mark.parametrize("command", ["generate", "check-exact"])
def test_keys_the_command_sets_are_refused_naming_its_own(prompts, tmp_path, capsys, key, command):
    value = {"max_batch_size": 4, "max_model_len": 64, "device": "cpu:0", "dtype": "float64", "seed": 5}[key]
    out = [f"output={tmp_path / 'o.jsonl'}"] if command == "generate" else []
    assert main([command, f"prompts={prompts}", *out, *BASE, f"engine.{key}={value}"]) == 2
    err = capsys.readouterr().err
    prefix = command.replace("-", "_")
    own = ENGINE_KEYS_SET_ELSEWHERE[key].split(" ")[0]
    assert f"{prefix}.engine.{key}: " in err and f"set {own}" in err
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize(("config", "schema"), [("generate", GenerateConfig), ("check_exact", CheckExactConfig)])
def test_shipped_engine_section_is_the_engine_default(config, schema, prompts):
    overrides = [f"prompts={prompts}"] + (["output=o.jsonl"] if config == "generate" else [])
    ConfigStore.instance().store(name=f"{config}_schema", node=schema)
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name=config, overrides=overrides))
    assert cfg.engine == EngineConfig()
    assert cfg.engine_config(5, 77) == EngineConfig(max_batch_size=5, max_model_len=77, device="cpu", dtype="float32")
