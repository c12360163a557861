"""A run continued in place at step S keeps the metrics.jsonl lines of the steps before S; the later ones (run after
the last checkpoint) move to metrics.replaced.jsonl, a last line cut short by a kill among them; a damaged line
before the last is an error naming it."""

from __future__ import annotations

import json

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
