"""Files written whole or not at all: through a temporary file beside the target, renamed into place. Every
package writes its small files this way (the calibration cache, run state, reports, bandit states); a full disk
is one ValueError saying what was kept."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix, for writers that go by it) to write; renamed over ``path``
    (keeping its permissions) when the block ends without an error, else removed."""
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~current_umask()
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as err:
        raise no_space(err, f"{path}; it is left as it was") from None
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` through a temporary file renamed into place."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


class NoSpaceError(ValueError):
    """A write that found no room (``no_space``): a ValueError, so the CLI says it in one line."""


def no_space(err: OSError, where: str) -> Exception:
    """A full disk, a quota or a file-size limit (``ulimit -f``) as one ValueError saying what was kept (the CLI
    prints it as one line); any other OSError unchanged."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return NoSpaceError(f"no space left writing {where}")
    if err.errno == errno.EFBIG:
        return NoSpaceError(f"file too large (a file-size limit: ulimit -f) writing {where}")
    return err


def command_os_error(err: OSError, after: str) -> Exception:
    """An OSError that ends a command, as one ValueError where it is the user's to fix: a full disk, a quota or a
    size limit (``no_space``, with ``after``: what to do and what is kept), a path with a name longer than the file
    system takes (named); any other OSError unchanged (a traceback is due)."""
    if err.errno == errno.ENAMETOOLONG:
        return ValueError(f"{err.filename or 'a path'}: a file name in it is too long for the file system")
    return no_space(err, f"{err.filename or 'a file'}: {after}")


def with_default_modes(root: Path) -> None:
    """Give the directory ``root`` and everything under it the modes ``mkdir`` and ``open`` would have (0777 and
    0666 less the umask): a tree built in ``tempfile.mkdtemp`` (0700) and written by libraries that create their
    files 0600 (safetensors) is renamed into a shared cache readable by its other users."""
    umask = current_umask()
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (``/proc/self/status``): setting it to read
    it, the only portable way, leaves a moment in which other threads create files with mode 0666/0777."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask
