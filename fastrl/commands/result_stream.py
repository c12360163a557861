"""Streaming generation results to a JSONL output as requests finish, resuming from what an interrupted run left.

Every record carries ``"index"``: the position of its prompt among the prompt lines. Records are appended (and
flushed) in the order requests finish; when the output is a regular file, ``finish`` rewrites it in index order
(through a temporary file renamed over the file, never over a symlink, which is resolved first). A FIFO or a device
is only opened and written.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import IO, Any

from fastrl.atomic_files import write_atomic
from fastrl.commands.output_guard import OutputTarget

INDEX_KEY = "index"
ERROR_REASON = "error"  # the finish_reason of a request that failed


class ResultStream:
    """Appends records to ``target``; ``resume`` keeps the complete records already there (see ``done``) but those
    that ended in an error: their lines run again (a prompt fixed since is taken, not refused as another prompt)."""

    def __init__(self, target: OutputTarget, resume: bool) -> None:
        self.target = target
        self.done: dict[int, dict[str, Any]] = {}
        if resume and target.regular and target.exists:
            kept = _read_finished(target.path).items()
            self.done = {i: record for i, record in kept if record.get("finish_reason") != ERROR_REASON}
        self._file: IO[str] | None = None

    def open(self) -> None:
        """Open for appending after the kept records (a fresh file when nothing is kept)."""
        path = self.target.path
        if self.target.regular:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not self.done:
                path.write_text("")
        self._file = path.open("a" if self.target.regular else "w", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (strict JSON: no NaN or infinity) and flush it."""
        assert self._file is not None, "open() first"
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        self.done[record[INDEX_KEY]] = record

    def close(self) -> None:
        """Close the file; a failing final flush (the disk is full) loses only the unflushed, unrecorded line."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def finish(self) -> None:
        """Close; a regular file whose records are out of index order, or hold an index twice (an error record of an
        earlier run and its line's new one), is rewritten in order, one record an index."""
        self.close()
        if not self.target.regular:
            return
        lines = self.target.path.read_text(encoding="utf-8").splitlines()
        indices = [json.loads(line)[INDEX_KEY] for line in lines]
        if indices == sorted(set(indices)):
            return
        ordered = [json.dumps(self.done[i], allow_nan=False) + "\n" for i in sorted(self.done)]
        write_atomic(self.target.path, "".join(ordered))


def _read_finished(path: Path) -> dict[int, dict[str, Any]]:
    """The complete records of an earlier run, by index. A last line without its newline (the run was killed while
    writing it) is cut off the file; any malformed complete line is a ValueError naming the file and line."""
    raw = path.read_bytes()
    complete = raw[: raw.rfind(b"\n") + 1]
    records: dict[int, dict[str, Any]] = {}
    for line_no, line in enumerate(complete.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
            index = record[INDEX_KEY]
            if isinstance(index, bool) or not isinstance(index, int):
                raise TypeError("'index' is not an integer")
        except (UnicodeDecodeError, json.JSONDecodeError, TypeError, KeyError) as err:
            raise ValueError(
                f"{path}:{line_no}: not a result line of `fastrl generate` ({type(err).__name__}: {err}); "
                "delete the file or pass resume=false"
            ) from None
        records[index] = record
    if len(complete) < len(raw):
        with path.open("r+b") as f:
            f.truncate(len(complete))
    return records
