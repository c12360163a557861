"""Checking where a command will write before it does any work: one ValueError naming the key and the path."""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class OutputTarget:
    """A checked output path. ``path``: where to write (a symlink resolved to its target, so the link itself is
    never replaced); ``regular``: a regular file or a new one (may be rewritten through a temporary file and a
    rename); otherwise a FIFO, a device or a socket, which is only ever opened and written in place."""

    key: str
    given: Path
    path: Path
    regular: bool

    @property
    def exists(self) -> bool:
        return self.path.exists()


def check_output(key: str, value: str, inputs: dict[str, str]) -> OutputTarget:
    """Check the output ``value`` of config key ``key``: not a directory, not one of ``inputs`` (key -> path), its
    directory exists (it is created if needed) and takes new files, and an existing file is writable. Nothing is
    written to the output itself."""
    given = Path(value)
    if given.is_symlink() and not given.exists():
        raise ValueError(f"{key}={value}: a dangling symlink (its target {os.readlink(given)} does not exist)")
    path = given.resolve() if given.is_symlink() else given
    for other_key, other in inputs.items():
        if other and _same_file(path, Path(other)):
            raise ValueError(f"{key}={value} is the {other_key} file: writing it would destroy the input")
    if path.exists():
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise ValueError(f"{key}={value} is a directory; give a file name")
        regular = stat.S_ISREG(mode)
        if not os.access(path, os.W_OK):
            raise ValueError(f"{key}={value} is not writable")
        if regular:
            _probe_directory(key, value, path.parent)  # the final rewrite in order needs a file beside it
        return OutputTarget(key, given, path, regular)
    parent = _existing_ancestor(path.parent)
    if not parent.is_dir():
        raise ValueError(f"{key}={value}: {parent} is not a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{key}={value}: cannot create its directory ({err.strerror})") from None
    _probe_directory(key, value, path.parent)
    return OutputTarget(key, given, path, True)


def _probe_directory(key: str, value: str, directory: Path) -> None:
    """ValueError unless a file can be created in ``directory`` (tried for real: permission bits lie to root)."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as err:
        raise ValueError(f"{key}={value}: cannot create files in {directory} ({err.strerror})") from None


def check_outputs(outputs: dict[str, str], inputs: dict[str, str]) -> dict[str, OutputTarget]:
    """``check_output`` for every non-empty output (key -> path); two keys naming the same file is a ValueError."""
    targets: dict[str, OutputTarget] = {}
    for key, value in outputs.items():
        if not value:
            continue
        target = check_output(key, value, inputs)
        for other in targets.values():
            if _same_file(target.path, other.path):
                raise ValueError(f"{key} and {other.key} name the same file {value}")
        targets[key] = target
    return targets


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def _existing_ancestor(directory: Path) -> Path:
    """The nearest ancestor of ``directory`` (itself included) that exists: where new directories would be made."""
    current = directory.absolute()
    while not current.exists() and current != current.parent:
        current = current.parent
    return current
