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
        self.redone: set[int] = set()  # indices of the earlier run's error records, whose lines run again
        self._complete_bytes: int | None = None  # where a half-written last record starts (cut by `open`)
        if resume and target.regular and target.exists:
            kept, self._complete_bytes = _read_finished(target.path)
            self.done = {i: record for i, record in kept.items() if record.get("finish_reason") != ERROR_REASON}
            self.redone = set(kept) - set(self.done)
        self._file: IO[str] | None = None

    def open(self) -> None:
        """Open for appending after the kept records (a fresh file when nothing is kept); a half-written last
        record is cut off here, once the run has passed its checks, not when the file is read."""
        path = self.target.path
        if self.target.regular:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not self.done:
                path.write_text("")
            elif self._complete_bytes is not None and self._complete_bytes < path.stat().st_size:
                with path.open("r+b") as f:
                    f.truncate(self._complete_bytes)
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
        """Close; a regular file whose records are out of index order, hold an index twice (an error record of an
        earlier run and its line's new one) or has blank lines between them (skipped when read), is rewritten in
        order, one record an index."""
        self.close()
        if not self.target.regular:
            return
        lines = self.target.path.read_text(encoding="utf-8").splitlines()
        indices = [json.loads(line)[INDEX_KEY] if line.strip() else None for line in lines]
        if indices == sorted(set(indices) - {None}):
            return
        ordered = [json.dumps(self.done[i], allow_nan=False) + "\n" for i in sorted(self.done)]
        write_atomic(self.target.path, "".join(ordered))


def _read_finished(path: Path) -> tuple[dict[int, dict[str, Any]], int]:
    """The complete records of an earlier run, by index, and the bytes they take: a last line without its newline
    is a record the run was killed while writing, to cut off (`ResultStream.open`), when it begins as a record does;
    any other text there, or any malformed complete line, is a ValueError naming the file and line (a file that
    is not a results file is never emptied)."""
    raw = path.read_bytes()
    complete = raw[: raw.rfind(b"\n") + 1]
    tail = raw[len(complete) :]
    if tail.strip() and not _record_prefix(tail):
        line_no = complete.count(b"\n") + 1
        raise ValueError(
            f"{path}:{line_no}: not a result line of `fastrl generate` (nor the start of one a run was killed while "
            "writing); delete the file or pass resume=false"
        )
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
    return records, len(complete)


def _record_prefix(tail: bytes) -> bool:
    """Whether text after the last newline can be what a run killed while writing a record left: the start of a
    JSON object that does not parse yet, or a whole record (one with an integer index) before its newline."""
    if not tail.lstrip().startswith(b"{"):
        return False
    try:
        whole = json.loads(tail.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return True
    index = whole.get(INDEX_KEY) if isinstance(whole, dict) else None
    return isinstance(index, int) and not isinstance(index, bool)
