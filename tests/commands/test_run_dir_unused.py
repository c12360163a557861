"""A new `fastrl train` run needs an empty directory: the error says whether it holds an earlier run (and how to
continue it) or other files (it said "holds an earlier run ... or it saved no checkpoint" of a folder of notes), and
W&B's files alone, which its service writes after a run that ended before its first step removed its directory,
leave it free for the same command again."""

from __future__ import annotations

import pytest

from fastrl.commands.run_dir import check_unused


def test_an_empty_directory_or_one_with_w_and_b_files_alone_is_unused(tmp_path):
    check_unused(tmp_path)
    (tmp_path / "wandb" / "offline-run-1" / "files").mkdir(parents=True)
    (tmp_path / "wandb" / "offline-run-1" / "files" / "output.log").write_text("x")
    check_unused(tmp_path)


def test_other_files_are_named_and_not_called_a_run(tmp_path):
    for name in ("notes.txt", "a", "b", "c"):
        (tmp_path / name).write_text("mine")
    with pytest.raises(ValueError, match=r"is not empty \(it holds a, b, c and 1 more\); a new run needs a new or "):
        check_unused(tmp_path)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_an_earlier_run_is_said_with_how_to_go_on(tmp_path, checkpoint):
    (tmp_path / "metrics.jsonl").write_text("")
    if checkpoint:
        (tmp_path / "checkpoints" / "step_000001").mkdir(parents=True)
        (tmp_path / "checkpoints" / "step_000001" / "trainer_state.json").write_text("{}")
    how = f"or continue that run with resume={tmp_path}" if checkpoint else r"\(it saved no checkpoint\)"
    with pytest.raises(ValueError, match=rf"holds an earlier run; a new run needs a new or empty directory .* {how}$"):
        check_unused(tmp_path)
