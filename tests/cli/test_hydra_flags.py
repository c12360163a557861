"""Hydra's conventions on every fastrl command: --help, --cfg job|hydra|all (with a space or `=`, and -c), --resolve,
--info, -m; none of them runs the command or writes anything."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from fastrl.cli import commands, main

COMMANDS = sorted(commands())
# a key every command's config has at its top level, as `--cfg job` prints it
TOP_KEY = {
    "train": "rl",
    "generate": "prompts",
    "bench": "workload",
    "check-exact": "prompts",
    "train-drafter": "num_prompts",
    "export-drafter": "format",
}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_names_the_command_its_groups_and_keys(command, capsys, tmp_path):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"fastrl {command}: ")
    assert "example: fastrl " in out and f"{TOP_KEY[command]}:" in out
    assert "--cfg job|hydra|all" in out
    if command == "train":
        assert "strategy: bandit, disable, ema, static" in out and "rl: grpo_tiny, grpo_tiny_long" in out
    else:  # no groups of its own: train's (train/strategy, ...) are not offered to it
        assert "Config groups" not in out and "train/" not in out
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("flags", [["--cfg", "job"], ["--cfg=job"], ["-c", "job"]])
def test_cfg_job_prints_the_config(command, flags, capsys, tmp_path):
    assert main([command, *flags]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert TOP_KEY[command] in config and "hydra" not in config
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_cfg_hydra_all_and_resolve(command, capsys):
    assert main([command, "--cfg", "hydra"]) == 0
    assert set(yaml.safe_load(capsys.readouterr().out)) == {"hydra"}
    assert main([command, "--cfg=all", "--resolve"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert "hydra" in config and TOP_KEY[command] in config
    assert "${" not in json.dumps(config.get("rl", {}))  # resolved: train's checkpoint_dir is a path


@pytest.mark.parametrize("command", COMMANDS)
def test_info_shows_search_path_and_defaults(command, capsys, tmp_path):
    assert main([command, "--info"]) == 0
    out = capsys.readouterr().out
    assert "Config search path" in out and "Defaults List" in out
    assert main([command, "--info", "defaults"]) == 0
    assert f"{command.replace('-', '_')}_schema" in capsys.readouterr().out
    assert os.listdir(tmp_path) == []


def test_cfg_job_shows_overrides_and_train_model_dir(capsys, tmp_path):
    model = tmp_path / "ckpt"
    model.mkdir()
    assert main(["train", "-c", "job", "rl.steps=3", f"model={model}", "strategy=static", "strategy.name=4_3_10"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["rl"]["steps"] == 3
    assert config["model"] == {"name": "local", "path": str(model)}
    assert config["strategy"]["name"] == "4_3_10"


@pytest.mark.parametrize("value", ["2024_01", "007", "1e3", "true", "12"])
def test_an_optional_string_key_keeps_the_value_as_typed(capsys, value):
    """`rl.checkpoint_dir` is `str | None`: it was left to Hydra's grammar, which read 2024_01 as 202401 (the
    checkpoints went to another directory); null still means None."""
    assert main(["train", "-c", "job", f"rl.checkpoint_dir={value}"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["rl"]["checkpoint_dir"] == value
    for null in ("null", "NULL", "Null"):  # Hydra's grammar reads null in any case
        assert main(["train", "-c", "job", f"rl.checkpoint_dir={null}"]) == 0
        assert yaml.safe_load(capsys.readouterr().out)["rl"]["checkpoint_dir"] is None


def test_cfg_with_a_bad_key_is_one_error(capsys):
    assert main(["generate", "--cfg", "job", "temperture=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["fastrl generate: error: `fastrl generate` has no key 'temperture'; did you mean 'temperature'?"]
    # A two-word command is named as typed, not as its config file (check_exact.yaml).
    assert main(["check-exact", "output=r.json"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("fastrl check-exact: error: `fastrl check-exact` has no key 'output'; top-level keys are")


def test_multirun_on_generate_runs_one_job_per_value(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [5, 6, 7]}\n')
    args = [f"prompts={prompts}", "max_new_tokens=3", "progress=false", "output=a.jsonl,b.jsonl"]
    assert main(["generate", "-m", *args]) == 0
    # each job's files carry its number (a sweep of another key would have sent every job into one output)
    assert sorted(os.listdir(tmp_path)) == ["a.job0.jsonl", "b.job1.jsonl", "p.jsonl", "runs"]
    (sweep,) = (tmp_path / "runs" / "multirun").iterdir()  # Hydra's record of the sweep, nothing else
    assert sweep.name.startswith("generate-") and os.listdir(sweep) == ["multirun.yaml"]
    first, second = ((tmp_path / n).read_text() for n in ("a.job0.jsonl", "b.job1.jsonl"))
    assert first == second and json.loads(first)["prompt_ids"] == [5, 6, 7]


def test_a_sweep_over_strategies_runs_each(tmp_path, capsys):
    """The check of every job before the first read `3_1_4` as Hydra's integer 314 (the jobs themselves quote it):
    every sweep over S_K_N strategies was refused, naming a strategy the user never typed."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [5, 6, 7]}\n')
    args = [f"prompts={prompts}", "max_new_tokens=3", "progress=false", "output=o.jsonl", "strategy=3_1_4,12_1_13@0.3"]
    assert main(["generate", "-m", *args]) == 0, capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["o.job0.jsonl", "o.job1.jsonl", "p.jsonl", "runs"]
    tokens = [json.loads((tmp_path / f"o.job{j}.jsonl").read_text())["token_ids"] for j in (0, 1)]
    assert tokens[0] == tokens[1]  # two strategies, one output: the policy's


@pytest.mark.parametrize("values", ["0.5,-1", "3,abc"])
def test_a_sweep_with_a_bad_job_is_refused_before_any_job_runs(tmp_path, capsys, values):
    """Each job's config was checked when the job started: job 0 did all its work before job 1's bad value (a
    range error, or Hydra's multi-line type error) was refused."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [5, 6, 7]}\n')
    key = "temperature" if values == "0.5,-1" else "max_new_tokens"
    args = [f"prompts={prompts}", "progress=false", f"output={tmp_path / 'o.jsonl'}", f"{key}={values}"]
    assert main(["generate", "-m", *args]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("fastrl generate: error: sweep job ") and line.endswith("no job was run")
    assert sorted(os.listdir(tmp_path)) == ["p.jsonl"]


def test_usage_into_a_reader_that_stopped_is_quiet():
    """`fastrl -h | head -3`: the usage met a closed pipe and ended in a BrokenPipeError traceback."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader has gone before the usage is written
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fastrl.cli", "-h"], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120
        )
    finally:
        os.close(write)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("command", "args", "said"),
    [
        ("train", ["--cfg", "job", "rl.steps=abc"], "Error merging override rl.steps=abc (Value 'abc'"),
        ("train", ["+rl.steps=2", "--cfg", "job"], "Could not append to config"),
        ("train", ["rl.steps=abc", "--help"], "Error merging override rl.steps=abc"),
        ("train", ["--info", "rl.steps=abc"], "Error merging override rl.steps=abc"),
        ("train", ["-m", "--help", "rl.steps=1,abc"], "sweep job 1 (rl.steps=abc): bad config"),
        ("generate", ["prompts=p.jsonl", "output=o.jsonl", "temperature=abc", "--cfg", "job"], "to Float"),
    ],
)
def test_a_bad_type_with_a_print_flag_is_one_error(command, args, said, capsys, tmp_path):
    """With --cfg, --help or --info a value Hydra cannot merge printed Hydra's multi-line error and exited 1; it is
    the one line (exit 2) a plain run or -m prints."""
    assert main([command, *args]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"fastrl {command}: error: ") and f"bad config for `fastrl {command}`: " in line, line
    assert said in line
    assert os.listdir(tmp_path) == []


def test_print_flags_check_types_not_ranges(capsys):
    """--cfg shows a config whose values only the run would refuse (a range, a key a command needs)."""
    assert main(["train", "--cfg", "job", "rl.steps=0"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["rl"]["steps"] == 0
    assert main(["generate", "--cfg", "job", "temperature=-1"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["temperature"] == -1
