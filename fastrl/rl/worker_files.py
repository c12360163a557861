"""The per-worker files of a training checkpoint (co-training state, history indexes): how many worker slots a
checkpoint holds is recorded in its trainer_state.json, so a file that went missing is an error, never a worker
that silently starts empty."""

from __future__ import annotations

from pathlib import Path


def worker_slots(directory: Path, recorded: int | None, names: tuple[str, ...], what: str) -> int:
    """How many worker slots to read from ``directory``, whose slot i has the files ``name.format(i)`` for each of
    ``names``: ``recorded``, the count the checkpoint recorded, once every one of its files is there; for a checkpoint
    written before the counts were recorded (None), the slots whose first file is there. ValueError naming the
    directory or the first file missing (``what``: what the files hold, for the message)."""
    if recorded is None:
        count = len(list(directory.glob(names[0].format("*")))) if directory.is_dir() else 0
        why = f"{_slots(count)} found"
    else:
        count, why = recorded, f"the checkpoint recorded {what} for {_slots(recorded)}"
    if count and not directory.is_dir():
        raise ValueError(f"{directory} is missing ({why})")
    for i in range(count):
        for name in names:
            file = directory / name.format(i)
            if not file.is_file():
                raise ValueError(f"{file} is missing ({why})")
    return count


def _slots(count: int) -> str:
    return f"{count} worker slot{'' if count == 1 else 's'}"
