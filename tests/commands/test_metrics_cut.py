"""A run continued in place at step S keeps the metrics.jsonl lines of the steps before S; the later ones (run after
the last checkpoint) move to metrics.replaced.jsonl, a last line cut short by a kill among them; a damaged line
before the last is an error naming it; a kill at any write of the move loses no line, and the command run again
ends with every step where it belongs."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from fastrl.commands.run_dir import keep_metrics_before


def _lines(steps: list[int]) -> list[str]:
    return [json.dumps({"step": s, "reward_mean": 0.1 * s}) for s in steps]


def test_steps_from_the_checkpoint_on_move_aside(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("\n".join(_lines([0, 1, 2, 3, 4])) + "\n")
    assert keep_metrics_before(tmp_path, 3) == 2
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == _lines([0, 1, 2])
    assert (tmp_path / "metrics.replaced.jsonl").read_text().splitlines() == _lines([3, 4])
    assert keep_metrics_before(tmp_path, 3) == 0  # nothing more to move


def test_a_last_line_cut_short_by_a_kill_moves_aside(tmp_path):
    torn = _lines([2])[0][:9]
    (tmp_path / "metrics.jsonl").write_text("\n".join([*_lines([0, 1]), torn]))
    assert keep_metrics_before(tmp_path, 2) == 1
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == _lines([0, 1])
    assert (tmp_path / "metrics.replaced.jsonl").read_text().splitlines() == [torn]


def test_a_damaged_line_before_the_last_is_named(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("\n".join([_lines([0])[0], "", "{garb", _lines([1])[0]]) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:3: not a line of metrics"):  # the file's own line number
        keep_metrics_before(tmp_path, 1)


class _Killed(BaseException):
    """A SIGKILL: the write under way stops where it is, and nothing after it runs."""


def _kill_at(monkeypatch, at: int) -> None:
    """The ``at``-th write (a file opened to write or append, a rename over a file) is killed: an open to write
    leaves its file truncated, an append or a rename does nothing."""
    real_open, real_replace = Path.open, os.replace
    count = itertools.count(1)

    def open_(self, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax") and next(count) == at:
            if "w" in mode:
                real_open(self, "w").close()
            raise _Killed
        return real_open(self, mode, *args, **kwargs)

    def replace(source, target):
        if next(count) == at:
            raise _Killed
        real_replace(source, target)

    monkeypatch.setattr(Path, "open", open_)
    monkeypatch.setattr(os, "replace", replace)


def _complete_lines(file: Path) -> set[str]:
    return set(file.read_text().split("\n")[:-1]) if file.is_file() else set()


def test_a_kill_at_any_write_loses_no_line_and_the_command_run_again_ends_whole(tmp_path, monkeypatch):
    """Every line is in metrics.jsonl or metrics.replaced.jsonl at every instant (metrics.jsonl was truncated, then
    written: a kill between lost the steps before the checkpoint for good), and the resume run again after the kill
    ends as one that was never killed, the moved lines in metrics.replaced.jsonl once."""
    lines, earlier = _lines([0, 1, 2, 3, 4]), _lines([9])  # earlier: what an earlier resume moved aside
    for at in itertools.count(1):
        run = tmp_path / f"kill_{at}"
        run.mkdir()
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        (run / "metrics.replaced.jsonl").write_text("\n".join(earlier) + "\n")
        killed = False
        with monkeypatch.context() as patch:
            _kill_at(patch, at)
            try:
                keep_metrics_before(run, 3)
            except _Killed:
                killed = True
        assert set(lines) <= _complete_lines(run / "metrics.jsonl") | _complete_lines(run / "metrics.replaced.jsonl")
        keep_metrics_before(run, 3)
        assert (run / "metrics.jsonl").read_text().splitlines() == _lines([0, 1, 2]), at
        assert (run / "metrics.replaced.jsonl").read_text().splitlines() == [*earlier, *_lines([3, 4])], at
        if not killed:
            break
    assert at > 2  # the move has two writes at least
