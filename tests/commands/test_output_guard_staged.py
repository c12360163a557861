"""``staged_directory`` puts a command's files into its output all together or not at all: a directory where a file
goes is refused before the first rename, and a rename that fails puts back the files replaced before it (an
overwrite used to stop halfway with an IsADirectoryError, the output left with old and new files mixed)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from fastrl.commands.output_guard import OutputTarget
from fastrl.commands.staged_output import staged_directory


def _target(final: Path) -> OutputTarget:
    return OutputTarget(key="output", given=final, path=final, regular=True)


def _snapshot(directory: Path) -> dict[str, bytes | str]:
    """Every path under ``directory``: a file's bytes, a directory as 'dir'."""
    return {
        str(p.relative_to(directory)): "dir" if p.is_dir() else p.read_bytes() for p in sorted(directory.rglob("*"))
    }


def _earlier_output(tmp_path: Path) -> Path:
    final = tmp_path / "out"
    final.mkdir()
    (final / "a.json").write_text("old a")
    (final / "b.bin").write_text("old b")
    (final / "map.pt").write_text("old map")
    (final / "README.md").write_text("mine")
    return final


def _stage(staging: Path) -> None:
    for name in ("a.json", "b.bin", "c.txt"):
        (staging / name).write_text(f"new {name}")


def test_a_directory_where_a_file_goes_is_refused_before_any_rename(tmp_path):
    final = _earlier_output(tmp_path)
    (final / "b.bin").unlink()
    (final / "b.bin").mkdir()
    (final / "b.bin" / "f").write_text("x")
    before = _snapshot(final)
    with pytest.raises(ValueError, match=rf"^output={final}: {final / 'b.bin'} is a directory where this command "):
        with staged_directory(_target(final), owned=("map.pt",)) as staging:
            _stage(staging)
    assert _snapshot(final) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "no staging or backup directory is left"


def test_an_owned_name_that_is_a_directory_is_refused_not_emptied(tmp_path):
    final = _earlier_output(tmp_path)
    (final / "map.pt").unlink()
    (final / "map.pt").mkdir()
    (final / "map.pt" / "keep").write_text("x")
    before = _snapshot(final)
    with pytest.raises(ValueError, match="map.pt is a directory where this command removes an earlier"):
        with staged_directory(_target(final), owned=("map.pt",)) as staging:
            _stage(staging)
    assert _snapshot(final) == before


def test_a_rename_that_fails_halfway_puts_back_every_file_replaced_before_it(tmp_path, monkeypatch):
    final = _earlier_output(tmp_path)
    before = _snapshot(final)
    real_replace = os.replace

    def failing_replace(src, dst):
        if Path(dst) == final / "c.txt":  # a.json and b.bin are replaced by then
            raise PermissionError(errno.EACCES, "Permission denied", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(ValueError, match=rf"^output={final}: cannot write {final / 'c.txt'} \(Permission denied\); "):
        with staged_directory(_target(final), owned=("map.pt",)) as staging:
            _stage(staging)
    monkeypatch.undo()
    assert _snapshot(final) == before, "old and new files were left mixed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_first_write_into_a_new_directory_leaves_no_directory(tmp_path, monkeypatch):
    final = tmp_path / "new" / "out"
    real_replace = os.replace

    def failing_replace(src, dst):
        if Path(dst).name == "b.bin":
            raise PermissionError(errno.EACCES, "Permission denied", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(ValueError, match=f"{final} is left as it was"):
        with staged_directory(_target(final)) as staging:
            _stage(staging)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == [], "neither the output nor the directory made above it is left"


def test_a_complete_write_replaces_its_files_removes_the_owned_and_keeps_the_others(tmp_path):
    final = _earlier_output(tmp_path)
    with staged_directory(_target(final), owned=("map.pt",)) as staging:
        _stage(staging)
        (staging / "sub").mkdir()
        (staging / "sub" / "d.txt").write_text("new d")
    assert _snapshot(final) == {
        "README.md": b"mine",
        "a.json": b"new a.json",
        "b.bin": b"new b.bin",
        "c.txt": b"new c.txt",
        "sub": "dir",
        "sub/d.txt": b"new d",
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("at", [1, 2, 3])
def test_an_interrupt_between_two_renames_waits_for_the_last(tmp_path, monkeypatch, at):
    """Ctrl-C (a real SIGINT) between two renames left one file of the old output and one of neither (the backup and
    the staging directory both removed on the way out): it now waits until every file is in place."""
    import signal

    import fastrl.commands.staged_output as staged_output

    final = _earlier_output(tmp_path)
    real, calls = os.replace, [0]

    def replace(src, dst):
        real(src, dst)
        calls[0] += 1
        if calls[0] == at:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(staged_output.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt, match="held to the end of writing output"):
        with staged_directory(_target(final), owned=("map.pt",)) as staging:
            _stage(staging)
    monkeypatch.setattr(staged_output.os, "replace", real)
    assert _snapshot(final) == {"README.md": b"mine", **{n: f"new {n}".encode() for n in ("a.json", "b.bin", "c.txt")}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "no staging or backup directory is left"


def test_a_rename_failing_with_an_interrupt_held_still_puts_back_the_old_output(tmp_path, monkeypatch):
    """A Ctrl-C held while a rename then failed (a full disk): the failure used to come out as the interrupt, past
    the undo, and the replaced files went with the backup. Now the old output is whole and the error names it."""
    import signal

    final = _earlier_output(tmp_path)
    before = _snapshot(final)
    real_replace, failed = os.replace, []

    def failing_replace(src, dst):
        if Path(dst) == final / "b.bin" and not failed:  # once: the undo puts the old b.bin back to this path
            failed.append(dst)
            os.kill(os.getpid(), signal.SIGINT)
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(ValueError, match="is left as it was") as caught:
        with staged_directory(_target(final), owned=("map.pt",)) as staging:
            _stage(staging)
    monkeypatch.undo()
    assert _snapshot(final) == before
    assert "signal 2 came during writing output" in " ".join(getattr(caught.value.__context__, "__notes__", []))


def test_a_second_interrupt_during_the_renames_puts_back_the_old_output(tmp_path, monkeypatch):
    """The user insists (two Ctrl-Cs): the renames stop at once, and the old output comes back whole."""
    import signal

    import fastrl.commands.staged_output as staged_output

    final = _earlier_output(tmp_path)
    before = _snapshot(final)
    real, calls = os.replace, [0]

    def replace(src, dst):
        real(src, dst)
        calls[0] += 1
        if calls[0] in (1, 2):
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(staged_output.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt, match="again"):
        with staged_directory(_target(final), owned=("map.pt",)) as staging:
            _stage(staging)
    monkeypatch.setattr(staged_output.os, "replace", real)
    assert _snapshot(final) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
