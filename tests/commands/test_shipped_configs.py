"""Every shipped config and every config group option composes as a user would compose it, and works: the decode
commands run one request with their defaults, `fastrl train`'s options build their rollout worker config (the
strategy selector included), so a YAML value such as an unquoted 8_4_32 (read as the integer 8432) cannot ship."""

from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from fastrl.adaptive.factory import build_selector
from fastrl.assets_path import bundled_model_dir
from fastrl.cli import main
from fastrl.commands.train_config import TrainConfig
from fastrl.commands.train_setup import worker_config
from fastrl.config_compose import conf_dir

TRAIN_GROUPS = sorted(p.name for p in (conf_dir() / "train").iterdir() if p.is_dir())


def _train_options() -> list[tuple[str, str]]:
    return [(g, f.stem) for g in TRAIN_GROUPS for f in sorted((conf_dir() / "train" / g).glob("*.yaml"))]


@pytest.mark.parametrize("group, option", _train_options())
def test_every_train_group_option_composes_and_builds(group, option, tmp_path):
    overrides = [f"{group}={option}", f"rl.checkpoint_dir={tmp_path}"]  # the run directory is Hydra's at run time
    if (group, option) == ("model", "local"):
        overrides.append(f"model.path={bundled_model_dir()}")
    worker = worker_config(_compose_train(overrides))
    assert isinstance(worker.strategy, str)
    build_selector(worker.strategy, bandit=worker.bandit, ema=worker.ema)  # the strategy string parses


def test_static_strategy_yaml_is_the_string_it_says(tmp_path):
    assert _compose_train(["strategy=static", f"rl.checkpoint_dir={tmp_path}"]).strategy.name == "5_1_6"


def _compose_train(overrides: list[str]) -> TrainConfig:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    with initialize_config_dir(config_dir=str(conf_dir() / "train"), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="train", overrides=overrides))


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"prompt": "3+4="}) + "\n")
    return path


def test_check_exact_defaults_run_one_request(prompts, tmp_path, capsys):
    report = tmp_path / "report.json"
    assert main(["check-exact", f"prompts={prompts}", f"report={report}", "max_new_tokens=8", "progress=false"]) == 0
    assert "check-exact 8_4_32" in capsys.readouterr().out
    assert json.loads(report.read_text())


@pytest.mark.parametrize(
    "strategy", ["disable", "bandit", "ema", "8_4_32", "12_1_13@0.3", "suffix_8", "3_1_4+suffix_8"]
)
def test_generate_defaults_run_one_request(prompts, tmp_path, strategy):
    out = tmp_path / "out.jsonl"
    args = [f"prompts={prompts}", f"output={out}", "max_new_tokens=8", "progress=false", f"strategy={strategy}"]
    assert main(["generate", *args]) == 0
    assert len(out.read_text().splitlines()) == 1


def test_train_loads_the_drafter_shipped_for_a_named_model_as_generate_does(policy_dir, tmp_path):
    import shutil

    from fastrl.assets_path import assets_dir
    from fastrl.commands.engine_setup import drafter_dir
    from fastrl.models.named import MARKER_FILE, SMOLLM2

    model = tmp_path / "named"
    shutil.copytree(policy_dir, model)
    overrides = [f"model.path={model}", f"rl.checkpoint_dir={tmp_path}"]
    with pytest.raises(ValueError, match=r"drafter.path: no drafter ships with .*drafter=fresh"):
        worker_config(_compose_train(overrides))  # a plain directory: no shipped drafter
    assert worker_config(_compose_train([*overrides, "drafter=fresh"])).drafter_dir == ""
    (model / MARKER_FILE).write_text(json.dumps({"name": "smollm2"}))  # what a converted named model carries
    shipped = worker_config(_compose_train(overrides)).drafter_dir
    assert shipped == str(assets_dir() / SMOLLM2.drafter_asset) == str(drafter_dir("", model))
    given = worker_config(_compose_train([*overrides, f"drafter.path={tmp_path}"])).drafter_dir
    assert given == str(tmp_path)
