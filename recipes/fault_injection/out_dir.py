"""The output directory of a fault-injection script: emptied for a new campaign only when an earlier run of the same
script made it (a marker file says so, naming the script); any other non-empty directory (another script's finished
results among them) is refused, never removed."""

from __future__ import annotations

import shutil
from pathlib import Path

MARKER = ".fault_injection"


def fresh_out(out: Path, script: str) -> None:
    """Make ``out`` an empty directory holding this script's marker. ValueError naming ``--out``, and nothing
    removed, when it is a file, cannot be made, or holds files an earlier ``script`` run did not write (no marker,
    or another script's: ``run.py``'s results are not ``campaign.py``'s to wipe)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a directory")
    if out.is_dir() and any(out.iterdir()):
        marker = out / MARKER
        owner = marker.read_text(errors="replace").strip() if marker.is_file() else None
        if owner is None:
            raise ValueError(
                f"--out {out} holds files a fault-injection run did not write; give a new or empty directory"
            )
        if owner != script:
            raise ValueError(f"--out {out} holds the results of {owner}, not {script}; give a new or empty directory")
    try:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        (out / MARKER).write_text(f"{script}\n")
    except OSError as err:
        raise ValueError(f"--out {out} cannot be made ({err.strerror})") from None
