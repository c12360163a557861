"""The close of a `fastrl train` run: its report survives an interrupt while it is drawn and is drawn by a resume
that finds it missing, a full disk names the way on (resume only when a checkpoint was finished) and leaves no
half-written checkpoint, and a resume refused by another command's lock names ``resume=`` as typed."""

from __future__ import annotations

import errno
import os
import signal

import pytest

from fastrl.cli import main
from fastrl.commands.output_guard import guard_outputs
from fastrl.commands.run_dir import RUN_DIR_KEY, latest_checkpoint
from tests.cli.test_train_run_dirs import TINY, _steps

REPORTED = [*[a for a in TINY if a != "report=false"], "report=true"]


def test_an_interrupt_while_the_report_is_drawn_waits_for_the_report(policy_dir, tmp_path, monkeypatch):
    """Ctrl-C after the last step, while the closing summary and report ran: report.png was never written."""
    import fastrl.commands.train as train_command

    original = train_command.plot_train_report

    def interrupted_while_drawing(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)

    monkeypatch.setattr(train_command, "plot_train_report", interrupted_while_drawing)
    run = tmp_path / "run"
    assert main(["train", *REPORTED, f"model={policy_dir}", "rl.steps=1", f"hydra.run.dir={run}"]) == 130
    assert (run / "report.png").is_file()


def test_a_resume_of_a_finished_run_draws_the_report_it_lacks(policy_dir, tmp_path, capsys):
    """A run killed while its report was drawn: resume said 'nothing left to do' and the report stayed missing."""
    run = tmp_path / "run"
    args = ["train", *REPORTED, f"model={policy_dir}", "rl.steps=2", "rl.checkpoint_every=1", f"hydra.run.dir={run}"]
    assert main(args) == 0
    report = run / "report.png"
    report.unlink()
    capsys.readouterr()
    assert main(["train", f"resume={run}"]) == 0
    out = capsys.readouterr().out
    assert "nothing left to do" in out and f"report: {report} (drawn from metrics.jsonl" in out
    assert report.is_file() and _steps(run) == [0, 1]
    drawn = report.stat().st_mtime_ns
    assert main(["train", f"resume={run}"]) == 0  # there: left as it is
    assert "report:" not in capsys.readouterr().out and report.stat().st_mtime_ns == drawn


@pytest.mark.parametrize("failing_save", [1, 2])
def test_a_full_disk_says_resume_only_after_a_finished_checkpoint(
    failing_save, policy_dir, tmp_path, monkeypatch, capsys
):
    """A checkpoint save that found the disk full: the error said 'resume' when no checkpoint was finished (resume
    then refused the run), and the half-written step_XXXXXX.tmp stayed."""
    import fastrl.rl.checkpoint as checkpoint_module

    original, calls = checkpoint_module.save_optimizer, [0]

    def full_disk(optimizer, directory):
        calls[0] += 1
        if calls[0] >= failing_save:
            raise OSError(errno.ENOSPC, "No space left on device", str(directory / "optimizer.safetensors"))
        return original(optimizer, directory)

    monkeypatch.setattr(checkpoint_module, "save_optimizer", full_disk)
    run = tmp_path / "run"
    args = ["train", *TINY, f"model={policy_dir}", "rl.steps=2", "rl.checkpoint_every=1", f"hydra.run.dir={run}"]
    assert main(args) == 2
    (error,) = [x for x in capsys.readouterr().err.splitlines() if "error:" in x]
    assert "no space left writing" in error
    assert not list((run / "checkpoints").glob("step_*.tmp"))
    if failing_save == 1:
        assert latest_checkpoint(run) is None
        assert "resume=" not in error and "start the run anew in a new directory" in error
    else:
        assert latest_checkpoint(run) == run / "checkpoints" / "step_000001"
        assert f"resume={run}" in error


def test_a_resume_refused_by_the_lock_names_resume_as_typed(policy_dir, tmp_path, capsys):
    """A second `fastrl train resume=RUN` named hydra.run.dir=RUN, a key the user had not typed."""
    run = tmp_path / "run"
    args = ["train", *TINY, f"model={policy_dir}", "rl.steps=1", "rl.checkpoint_every=1", f"hydra.run.dir={run}"]
    assert main(args) == 0
    capsys.readouterr()
    with guard_outputs({}, {}, work_dirs={RUN_DIR_KEY: str(run)}):  # another command runs in it
        assert main(["train", f"resume={run}", "rl.steps=2"]) == 2
    assert f"error: resume={run} is being written by another fastrl command" in capsys.readouterr().err
