"""Run directories of `fastrl train` (issue 27, item 2): unique per run, resume= a run directory (its latest
checkpoint, in place, with the overrides it was started with) or a checkpoint, "nothing left to do" said, train.log
holds the run's log, Ctrl-C says where the last checkpoint is and how to continue (and saves one when asked)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastrl.cli import main
from fastrl.commands.run_dir import latest_checkpoint

TINY = [
    "drafter=fresh",
    "rollout=local",
    "logger=none",
    "rl.prompts_per_step=2",
    "rl.samples_per_prompt=2",
    "rl.max_new_tokens=8",
    "rl.lr=1e-3",
    "task.n_max=6",
    "report=false",
]


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _rewards(run: Path) -> list[float]:
    return [json.loads(line)["reward_mean"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_default_run_directories_are_unique(policy_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["train", *TINY, f"model={policy_dir}", "rl.steps=1", "rl.checkpoint_every=0"]
    assert main(args) == 0 and main(args) == 0
    runs = sorted((tmp_path / "runs" / "train").iterdir())
    assert len(runs) == 2 and all(len(r.name.split("-")) == 3 for r in runs)  # date-time-id
    assert all(_steps(r) == [0] for r in runs)


def test_resume_a_run_directory_continues_it_in_place(policy_dir, tmp_path, capsys):
    straight, run = tmp_path / "straight", tmp_path / "run"
    base = ["train", *TINY, f"model={policy_dir}", "rl.checkpoint_every=1"]
    assert main([*base, "rl.steps=3", f"hydra.run.dir={straight}"]) == 0
    assert main([*base, "rl.steps=2", f"hydra.run.dir={run}"]) == 0
    capsys.readouterr()
    # the run's own overrides (model, TINY, ...) come from run/.hydra; only what changes is given
    assert main(["train", f"resume={run}", "rl.steps=3"]) == 0
    out = capsys.readouterr().out
    assert f"resuming {run / 'checkpoints' / 'step_000002'}: step 2 of 3" in out
    assert _steps(run) == [0, 1, 2] and _rewards(run) == _rewards(straight)
    assert latest_checkpoint(run) == run / "checkpoints" / "step_000003"
    # the checkpoint's policy is a model every command takes: its tokenizer is saved beside it
    from fastrl.models.tokenizer import load_tokenizer

    assert load_tokenizer(policy_dir) is not None and load_tokenizer(run / "checkpoints/step_000003/policy") is not None
    log = (run / "train.log").read_text()
    assert "step 2: reward" in log and f"resuming {run / 'checkpoints' / 'step_000002'}: step 2 of 3" in log
    # finished: said so, nothing changed
    before = (run / "metrics.jsonl").read_bytes()
    assert main(["train", f"resume={run}"]) == 0
    assert "is at step 3 of rl.steps=3: nothing left to do" in capsys.readouterr().out
    assert (run / "metrics.jsonl").read_bytes() == before


def test_resume_a_checkpoint_writes_a_new_run_directory(policy_dir, tmp_path, capsys):
    run, resumed = tmp_path / "run", tmp_path / "resumed"
    base = ["train", *TINY, f"model={policy_dir}", "rl.checkpoint_every=1"]
    assert main([*base, "rl.steps=1", f"hydra.run.dir={run}"]) == 0
    checkpoint = run / "checkpoints" / "step_000001"
    assert main([*base, "rl.steps=2", f"resume={checkpoint}", f"hydra.run.dir={resumed}"]) == 0
    assert _steps(run) == [0] and _steps(resumed) == [1]


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda d: d, "is neither a checkpoint (trainer_state.json is missing) nor a run directory"),
        (lambda d: d / "missing", "no such directory"),
        (lambda d: (d / "checkpoints").mkdir() or d, "that run saved no checkpoint to continue from (it wrote none)"),
        # a run killed before its first checkpoint: .hydra and metrics.jsonl, no checkpoints/ (it was "not a run
        # directory"), or one killed while writing its first checkpoint ("checkpoints is empty")
        (lambda d: (d / "metrics.jsonl").write_text("") or d, "start it anew in a new directory"),
        (
            lambda d: (d / "checkpoints" / "step_000002.tmp").mkdir(parents=True) or d,
            "holds only the unfinished step_000002.tmp",
        ),
    ],
)
def test_resume_what_is_not_a_run_is_one_error(make, words, tmp_path, capsys):
    target = make(tmp_path)
    assert main(["train", f"resume={target}", "rollout=local", "logger=none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fastrl train: error: resume={target}") and words in err[0]


def _start(policy_dir: Path, run: Path, *extra: str) -> subprocess.Popen:
    args = [*TINY, f"model={policy_dir}", "rl.steps=100000", "rl.checkpoint_every=1000", f"hydra.run.dir={run}"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "fastrl.cli", "train", *args, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _interrupt_after_two_steps(process: subprocess.Popen, run: Path) -> str:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if (run / "metrics.jsonl").is_file() and len(_steps(run)) >= 2:
            break
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 130, out
    return out


@pytest.mark.parametrize("save", [True, False])
def test_ctrl_c_says_where_the_checkpoint_is_and_how_to_continue(policy_dir, tmp_path, save):
    run = tmp_path / "run"
    out = _interrupt_after_two_steps(_start(policy_dir, run, f"checkpoint_on_interrupt={str(save).lower()}"), run)
    if save:
        latest = latest_checkpoint(run)
        assert latest is not None and int(latest.name.split("_")[1]) >= 2
        assert f"latest checkpoint: {latest}" in out and f"continue with: fastrl train resume={run}" in out
        assert "interrupted at step" in (run / "train.log").read_text()
    else:
        assert latest_checkpoint(run) is None
        assert "no checkpoint yet (checkpoint_on_interrupt=true saves one)" in out


def test_the_closing_line_names_checkpoints_only_when_the_run_wrote_some(tmp_path, capsys):
    """rl.checkpoint_every=0 writes none, and the closing line named a checkpoints/ that did not exist."""
    for every, run in ((0, tmp_path / "none"), (1, tmp_path / "some")):
        assert main(["train", *TINY, "rl.steps=1", f"rl.checkpoint_every={every}", f"hydra.run.dir={run}"]) == 0
        (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("run directory: ")]
        assert ("checkpoints/" in line) == (every > 0) == (run / "checkpoints").is_dir(), line


def test_a_run_started_with_a_context_past_the_policys_positions_resumes(tmp_path, monkeypatch, capsys):
    """A new run refuses rollout.engine.max_model_len past the policy's positions; a run started before that check
    (its engines served the policy's positions) resumes as it ran: the check refused its resume, and the resume
    check refused any other value, so no command line could continue it."""
    import fastrl.commands.train as train_command

    run = tmp_path / "run"
    args = [*TINY, "rl.checkpoint_every=1", "rollout.engine.max_model_len=2048"]
    assert main(["train", *args, "rl.steps=1", f"hydra.run.dir={tmp_path / 'new'}"]) == 2
    assert "rollout.engine.max_model_len=2048 exceeds the policy's 1024 positions" in capsys.readouterr().err
    with monkeypatch.context() as older:  # the run as a version without the check started it
        older.setattr(train_command, "check_context", lambda *a: None)
        assert main(["train", *args, "rl.steps=1", f"hydra.run.dir={run}"]) == 0
    assert main(["train", f"resume={run}", "rl.steps=2"]) == 0
    assert _steps(run) == [0, 1]


def test_a_step_that_fails_keeps_the_finished_steps_in_a_checkpoint_that_resumes(policy_dir, tmp_path, monkeypatch):
    """A reward that raises in step 2's rollout: only Ctrl-C saved a checkpoint, so the two finished steps were lost
    (rl.checkpoint_every=3) and resume was refused. Now the failure is raised after step 2's checkpoint, and the run
    resumed goes on as the same run uninterrupted does."""
    from fastrl.rl.tasks import ArithChainTask

    base = ["train", *TINY, f"model={policy_dir}", "rl.checkpoint_every=3", "rl.steps=4"]
    assert main([*base, f"hydra.run.dir={tmp_path / 'straight'}"]) == 0
    original, calls = ArithChainTask.reward, [0]

    def failing(self, problem, text):
        calls[0] += 1
        if calls[0] > 8:  # 4 samples a step: the first reward of step 2
            raise RuntimeError("reward service unavailable")
        return original(self, problem, text)

    monkeypatch.setattr(ArithChainTask, "reward", failing)
    run = tmp_path / "run"
    with pytest.raises(SystemExit):  # Hydra prints the failure and exits 1
        main([*base, f"hydra.run.dir={run}"])
    assert (run / "checkpoints" / "step_000002").is_dir() and _steps(run) == [0, 1]
    monkeypatch.setattr(ArithChainTask, "reward", original)
    assert main(["train", f"resume={run}"]) == 0
    assert _steps(run) == [0, 1, 2, 3] and _rewards(run) == _rewards(tmp_path / "straight")
