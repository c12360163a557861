"""`fastrl train` end to end through Hydra (groups, overrides, run directory) on a tiny random policy."""

from __future__ import annotations

import glob
import json
import time

import pytest

from fastrl.cli import main
from fastrl.rl.logprob_check import LogprobMismatchError

COMMON = [
    "model=local",
    "drafter=fresh",
    "rl.steps=2",
    "rl.prompts_per_step=2",
    "rl.samples_per_prompt=2",
    "rl.max_new_tokens=12",
    "rl.lr=1e-3",
    "rl.checkpoint_every=2",
    "task.n_max=6",
    "task.context_length=256",
]


def test_train_local_writes_metrics_and_report(policy_dir, tmp_path):
    run = tmp_path / "run"
    args = [
        *COMMON,
        f"model.path={policy_dir}",
        "rollout=local",
        "logger=none",
        "strategy=static",
        "strategy.name=3_1_4",
        f"hydra.run.dir={run}",
    ]
    assert main(["train", *args]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert [r["policy_version"] for r in rows] == [0, 1]
    assert all(r["mean_accept_length"] >= 1.0 for r in rows)
    assert (run / "report.png").read_bytes()[:4] == b"\x89PNG"
    assert (run / "checkpoints" / "step_000002").is_dir()


def test_train_ray_with_offline_wandb(policy_dir, tmp_path, capsys):
    run = tmp_path / "run"
    args = [
        *COMMON,
        f"model.path={policy_dir}",
        "rollout=ray",
        "rollout.num_workers=2",
        "strategy=bandit",
        "strategy.bandit.strategies=[2_1_3,disable]",
        f"hydra.run.dir={run}",
    ]
    assert main(["train", *args]) == 0
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    (events,) = (run / "wandb").glob("offline-run-*/*.wandb")
    hint = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("W&B offline run:"))
    pattern = hint.split("`wandb sync ")[1].rstrip("`)")  # the segments of this run, what `wandb sync` takes
    assert glob.glob(pattern) == [str(events.parent)]
    # the speed story: choices, rounds per arm, and the whole run's figures in the summary
    wanted = (b"choice/", b"arm_rounds/", b"rollout_tokens_per_s", b"run/estimated_speedup")
    deadline = time.monotonic() + 60.0  # W&B's service may still be writing its log when finish() returns
    while not all(key in (logged := events.read_bytes()) for key in wanted) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert all(key in logged for key in wanted), logged[:200]


def test_train_bad_override_is_an_error(policy_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *COMMON, f"model.path={policy_dir}", "rl.samples_per_prompt=0", f"hydra.run.dir={run}"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "fastrl train: error: rl.samples_per_prompt must be an integer >= 2, got 0"
    ]
    assert not run.exists()


def test_a_context_too_short_for_the_task_is_an_error_before_any_rollout(policy_dir, tmp_path, capsys):
    """The task's longest prompt (task.n_max terms of value_max) must leave room for a response: said once, before
    Ray or any worker starts, naming the key, not as a failed rollout's traceback at some later step."""
    run = tmp_path / "run"
    args = [*COMMON, f"model.path={policy_dir}", "rollout.engine.max_model_len=20", f"hydra.run.dir={run}"]
    assert main(["train", *args]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("fastrl train: error: rollout.engine.max_model_len=20 leaves no room for a response")
    assert "task.n_max=6" in line
    assert not run.exists()


def test_train_multirun_sweeps(policy_dir, tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        *COMMON,
        f"model.path={policy_dir}",
        "rollout=local",
        "logger=none",
        "report=false",
        "rl.checkpoint_every=0",
        f"hydra.sweep.dir={sweep}",
        "rl.lr=1e-3,2e-3",
    ]
    assert main(["train", "-m", *args]) == 0
    runs = sorted(p.parent.name for p in sweep.glob("*/metrics.jsonl"))
    assert runs == ["0", "1"]


def test_a_bfloat16_rollout_is_checked_against_its_own_rounding(tmp_path, capsys):
    """bfloat16 rollouts of the bundled model move a log-prob by a few hundredths from the trainer's float32
    recomputation: the default tolerance follows the rollout dtype (it raised at 1e-3 before), and an explicit one
    still rules."""
    common = ["rollout=local", "rollout.engine.dtype=bfloat16", "logger=none", "report=false", "rl.steps=1"]
    common += ["rl.prompts_per_step=2", "rl.max_new_tokens=32", "strategy=static", "strategy.name=3_1_4"]
    run = tmp_path / "bf16"
    assert main(["train", *common, f"hydra.run.dir={run}"]) == 0
    (row,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert 1e-3 < row["logprob_max_abs_diff"] <= 0.25
    strict = tmp_path / "strict"
    with pytest.raises(SystemExit):  # Hydra reports the trainer's error and exits 1
        main(["train", *common, "rl.logprob_tolerance=1e-3", f"hydra.run.dir={strict}"])
    assert f"{LogprobMismatchError.__name__}: rollout log-probs differ" in capsys.readouterr().err
