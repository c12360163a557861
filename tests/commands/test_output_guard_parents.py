"""A refused command creates nothing: the directories ``guard_outputs`` makes above a new output (it needs them for
its lock file) are removed on release when they are left empty, and ``staged_directory`` removes the ones it made
when its block fails (a refused export-drafter used to leave ``a/b/`` behind)."""

from __future__ import annotations

import pytest

from fastrl.assets_path import bundled_drafter_dir
from fastrl.cli import main
from fastrl.commands.output_guard import OutputTarget, guard_outputs
from fastrl.commands.staged_output import staged_directory


def _refused(tmp_path, **guarded) -> None:
    with pytest.raises(ValueError, match="refused"):
        with guard_outputs(**guarded):
            raise ValueError("refused: an input checked after the outputs")


def test_the_parents_of_a_refused_commands_outputs_are_removed(tmp_path):
    _refused(tmp_path, files={"output": str(tmp_path / "f" / "g" / "out.jsonl")}, inputs={})
    _refused(tmp_path, files={}, inputs={}, directories={"output": str(tmp_path / "d" / "e" / "out")})
    _refused(tmp_path, files={}, inputs={}, work_dirs={"stream_dir": str(tmp_path / "w" / "x" / "stream")})
    assert list(tmp_path.iterdir()) == []


def test_a_later_key_refused_removes_the_parents_an_earlier_one_made(tmp_path):
    (tmp_path / "a_dir").mkdir()
    files = {"output": str(tmp_path / "new" / "out.jsonl"), "stats_output": str(tmp_path / "a_dir")}
    with pytest.raises(ValueError, match="stats_output=.* is a directory"):
        guard_outputs(files, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_dir"]


def test_a_finished_command_keeps_its_outputs_parents_and_an_existing_parent_stays(tmp_path):
    (tmp_path / "kept").mkdir()
    _refused(tmp_path, files={"output": str(tmp_path / "kept" / "out.jsonl")}, inputs={})
    with guard_outputs({"output": str(tmp_path / "new" / "deep" / "out.jsonl")}, {}) as targets:
        targets["output"].path.write_text("done\n")
    assert (tmp_path / "new" / "deep" / "out.jsonl").read_text() == "done\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "new"]


def test_a_staged_directory_whose_block_fails_removes_the_parents_it_made(tmp_path):
    final = tmp_path / "a" / "b" / "out"
    with pytest.raises(ValueError, match="refused"):
        with staged_directory(OutputTarget("output", final, final, True)) as staging:
            (staging / "x").write_text("half")
            raise ValueError("refused")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("drafter", ["missing", "fused"])
def test_a_refused_export_creates_no_directory(tmp_path, capsys, drafter):
    source = tmp_path / "does-not-exist" if drafter == "missing" else bundled_drafter_dir()
    assert main(["export-drafter", str(source), str(tmp_path / "a" / "b" / "out")]) == 2
    assert "error" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
