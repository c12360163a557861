"""A rollout worker's error in one line names its type, whether it came from a Ray task or from this process (the
local backend's drafter rounds said `'fc.weight'` for a KeyError)."""

from __future__ import annotations

from fastrl.rollout.errors import short_error


class _TaskError(RuntimeError):
    """Like a Ray task error: a traceback for a message, the remote exception as ``cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"Traceback (most recent call last):\n  File x\n{type(cause).__name__}: {cause}")
        self.cause = cause


def test_local_and_remote_errors_read_alike():
    for err in (KeyError("fc.weight"), MemoryError("copying the trained drafter"), ValueError("a\nlast line")):
        assert short_error(err) == short_error(_TaskError(err))
    assert short_error(KeyError("fc.weight")) == "KeyError: 'fc.weight'"
    assert short_error(MemoryError()) == "MemoryError"
    assert short_error(ValueError("first\n\nlast line")) == "last line"
