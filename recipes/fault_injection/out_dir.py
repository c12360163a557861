"""The output directory of a fault-injection script: emptied for a new campaign only when an earlier fault-injection
campaign made it (a marker file says so, naming the script); any other non-empty directory is refused, never
removed."""

from __future__ import annotations

import shutil
from pathlib import Path

MARKER = ".fault_injection"


def fresh_out(out: Path, script: str) -> None:
    """Make ``out`` an empty directory holding this script's marker (SystemExit naming ``--out`` when it holds
    files no fault-injection script wrote)."""
    if out.exists() and not out.is_dir():
        raise SystemExit(f"--out {out} is a file; give a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise SystemExit(f"--out {out} holds files a fault-injection run did not write; give a new or empty directory")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / MARKER).write_text(f"{script}\n")
