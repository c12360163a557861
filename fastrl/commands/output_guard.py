"""The one output guard of every command: where a command will write is checked before it does any work, a second
concurrent writer is refused, and files reach their place by a rename. Errors are one ValueError naming the key.

``guard_outputs`` checks every output file and directory (not an input, not a directory where a file is expected,
not a file where a directory is, a non-empty directory only with ``overwrite=true``, writable) and takes an
exclusive ``fcntl`` lock per output (a hidden ``.NAME.lock`` beside it, removed on release, as are the directories
made above a new output when they are left empty: a refused command leaves nothing behind); an existing file that a
command rewrites only when it is its own (a run's stats or plot) is refused unless the command recognises it
(``check_own``). ``write_through``
(``fastrl.atomic_files`` for a plain path) and ``staged_output.staged_directory`` write through a temporary file
or directory renamed into place, so a failed or interrupted command never leaves a half-written output over a good
one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fastrl.atomic_files import atomic_path


@dataclass(frozen=True)
class OutputTarget:
    """A checked output path. ``path``: where to write (a symlink resolved to its target, so the link itself is
    never replaced); ``regular``: a regular file, a directory or a new one (may be rewritten through a temporary
    file and a rename); otherwise a FIFO, a device or a socket, which is only ever opened and written in place.
    ``made``: the directories the check created above it (outermost first), removed by ``GuardedOutputs.release``
    when they are left empty."""

    key: str
    given: Path
    path: Path
    regular: bool
    made: tuple[Path, ...] = ()

    @property
    def exists(self) -> bool:
        return self.path.exists()


def check_output(key: str, value: str, inputs: dict[str, str]) -> OutputTarget:
    """Check the output file ``value`` of config key ``key``: not a directory, not one of ``inputs`` (key -> path),
    its directory exists (it is created if needed) and takes new files, and an existing file is writable. Nothing
    is written to the output itself."""
    own = _own_stream(value)
    if own:  # its lines would mix with the command's own (a file's first records overwritten)
        raise ValueError(
            f"{key}={value} is this command's standard {own}, where it prints its progress and summary: name the "
            "file itself, or a named FIFO (mkfifo) to stream results to another program"
        )
    path = _resolved(key, value)
    _check_not_input(key, value, path, inputs)
    if path.exists():
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise ValueError(f"{key}={value} is a directory; give a file name")
        regular = stat.S_ISREG(mode)
        if not os.access(path, os.W_OK):
            raise ValueError(f"{key}={value} is not writable")
        if regular:
            _probe_directory(key, value, path.parent)  # the final rewrite in order needs a file beside it
        return OutputTarget(key, Path(value), path, regular)
    return OutputTarget(key, Path(value), path, True, _make_parent(key, value, path))


def check_output_dir(key: str, value: str, inputs: dict[str, str], overwrite: bool) -> OutputTarget:
    """Check the output directory ``value`` of ``key``: not a file, neither one of ``inputs`` nor inside one nor
    holding one, empty unless ``overwrite`` (then the files the command writes replace theirs, others stay), and
    its parent takes new files."""
    path = _resolved(key, value)
    _check_not_input(key, value, path, inputs)
    for other_key, other in inputs.items():
        if other and _contains(Path(other), path):
            raise ValueError(f"{key}={value} is inside the {other_key} directory {other}: writing there would mix them")
        if other and _contains(path, Path(other)):
            raise ValueError(f"{key}={value} holds the {other_key} {other}: writing there could destroy the input")
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{key}={value} is a file; give a directory")
        if any(path.iterdir()) and not overwrite:
            raise ValueError(
                f"{key}={value} is a directory that is not empty; choose a new one, or pass overwrite=true to "
                "replace the files this command writes there"
            )
        _probe_directory(key, value, path)
        return OutputTarget(key, Path(value), path, True)
    return OutputTarget(key, Path(value), path, True, _make_parent(key, value, path))


@dataclass
class GuardedOutputs:
    """Checked outputs by key, each under an exclusive lock until ``release`` (or the end of a ``with`` block)."""

    targets: dict[str, OutputTarget]
    locks: list[int] = field(default_factory=list)
    lock_files: list[Path] = field(default_factory=list)
    made: list[Path] = field(default_factory=list)  # the directories the checks created, outermost first

    def __getitem__(self, key: str) -> OutputTarget:
        return self.targets[key]

    def __contains__(self, key: str) -> bool:
        return key in self.targets

    def __enter__(self) -> GuardedOutputs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Remove the lock files and drop the locks (removal first, while still held: no other writer's lock goes),
        then the directories the checks created that are left empty: a command refused once its outputs were
        checked leaves nothing behind."""
        for fd, lock_file in zip(self.locks, self.lock_files, strict=True):
            with contextlib.suppress(OSError):
                lock_file.unlink()
            os.close(fd)
        remove_empty(self.made)
        self.locks, self.lock_files, self.made = [], [], []


def check_work_dir(key: str, value: str, inputs: dict[str, str]) -> OutputTarget:
    """Check a directory a command keeps across its runs and resumes from (``train-drafter``'s stream of shards and
    saved state): not a file, not an input, taking new files (its parent is created if needed: ``made``). What it may
    hold is the command's rule (``train-drafter``: ``stream_trainer.check_stream_dir``), not this check's."""
    path = _resolved(key, value)
    _check_not_input(key, value, path, inputs)
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{key}={value} is a file; give a directory")
        _probe_directory(key, value, path)
        return OutputTarget(key, Path(value), path, True)
    # the directory itself is made by the first write: a refused run leaves none (nor the parents, on release)
    return OutputTarget(key, Path(value), path, True, _make_parent(key, value, path))


Recognise = Callable[[Path], str | None]
"""Why an existing, non-empty output file is none the command writes, as the end of a sentence naming it ("is not
a stats JSON of ..."); None: it is one (a rerun rewrites it, a resumed run reads it)."""


def guard_outputs(
    files: dict[str, str],
    inputs: dict[str, str],
    directories: dict[str, str] | None = None,
    overwrite: bool = False,
    work_dirs: dict[str, str] | None = None,
    own: dict[str, Recognise] | None = None,
) -> GuardedOutputs:
    """Check every non-empty output file (``files``: key -> path), directory and work directory (``work_dirs``,
    see ``check_work_dir``), then lock each; two keys naming the same path, a bad path or an output another process
    is writing is a ValueError naming the key (the directories the checks created are removed again). ``own``: for
    the files the command rewrites only when they are its own (key -> ``Recognise``), an existing file it does not
    recognise (notes a path was mistyped over) is refused and left as it is (``check_own``)."""
    checked = [(k, v, "file") for k, v in files.items() if v]
    checked += [(k, v, "dir") for k, v in (directories or {}).items() if v]
    checked += [(k, v, "work") for k, v in (work_dirs or {}).items() if v]
    guarded = GuardedOutputs({})
    try:
        for key, value, kind in checked:
            if kind == "file":
                target = check_output(key, value, inputs)
            elif kind == "dir":
                target = check_output_dir(key, value, inputs, overwrite)
            else:
                target = check_work_dir(key, value, inputs)
            guarded.made += target.made
            for other in guarded.targets.values():
                if _same_file(target.path, other.path):
                    raise ValueError(f"{key} and {other.key} name the same file {value}")
            guarded.targets[key] = target
        for target in guarded.targets.values():
            if target.regular:
                _lock(guarded, target)
        for key, recognise in (own or {}).items():
            if key in guarded:  # read under the lock: no other fastrl command is rewriting it meanwhile
                check_own(guarded[key], recognise)
    except BaseException:
        guarded.release()
        raise
    return guarded


def check_own(target: OutputTarget, recognise: Recognise) -> None:
    """ValueError naming the key when ``target`` is an existing, non-empty regular file that ``recognise`` does not
    take for one the command wrote: it is never overwritten. A new or empty file, a FIFO or a device passes."""
    if not target.regular or not target.path.is_file() or target.path.stat().st_size == 0:
        return
    why = recognise(target.path)
    if why is not None:
        raise ValueError(
            f"{target.key}={target.given} {why}; it is not overwritten: delete the file or name another {target.key}"
        )


IMAGE_SIGNATURES = {
    "png": (b"\x89PNG\r\n\x1a\n",),
    "pdf": (b"%PDF-",),
    "eps": (b"%!PS",),
    "ps": (b"%!PS",),
    "svg": (b"<?xml", b"<svg"),
    "svgz": (b"\x1f\x8b",),  # gzip
    "jpg": (b"\xff\xd8\xff",),
    "jpeg": (b"\xff\xd8\xff",),
    "tif": (b"II*\x00", b"MM\x00*"),
    "tiff": (b"II*\x00", b"MM\x00*"),
    "gif": (b"GIF87a", b"GIF89a"),
    "webp": (b"RIFF",),
    "pgf": (b"%% Creator: Matplotlib",),
}
"""How a file of each image format a plot is drawn in begins, by the suffix that names the format (a raw bitmap,
``.raw`` or ``.rgba``, has no signature to tell it by; an ``.avif`` file's is not at its start: neither is told)."""


def image_file_problem(path: Path) -> str | None:
    """``Recognise`` of a plot output: None when the file begins as an image of the format its suffix names does
    (or the format has no signature), else why it is no plot."""
    suffix = path.suffix.lstrip(".").lower()
    signatures = IMAGE_SIGNATURES.get(suffix)
    if signatures is None:
        return None
    try:
        with path.open("rb") as f:
            head = f.read(64)
    except OSError as err:
        return f"cannot be read to tell whether it is a plot ({err.strerror})"
    if any(head.startswith(s) for s in signatures):
        return None
    return f"is not a .{suffix} image (it does not begin as one), so not a plot an earlier run drew"


def _lock(guarded: GuardedOutputs, target: OutputTarget) -> None:
    """Take the exclusive lock of ``target`` (``.NAME.lock`` beside it; retried when another process removed the
    file between our open and our lock); ValueError naming the key when another process holds it."""
    lock_file = target.path.parent / f".{target.path.name}.lock"
    while True:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ValueError(
                f"{target.key}={target.given} is being written by another fastrl command (pid {holder}); wait for "
                "it to finish or choose another output"
            ) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock_file))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    guarded.locks.append(fd)
    guarded.lock_files.append(lock_file)


def write_through(target: OutputTarget, write: Callable[[Path], None]) -> None:
    """``write(path)`` into a checked output: through a temporary file renamed into place for a regular file, in
    place for a FIFO or a device (never replaced)."""
    if not target.regular:
        write(target.path)
        return
    with atomic_path(target.path) as tmp:
        write(tmp)


def write_text(target: OutputTarget, text: str) -> None:
    """``text`` (UTF-8) into a checked output, as ``write_through`` does."""
    write_through(target, lambda path: path.write_text(text, encoding="utf-8"))


def make_dirs(directory: Path, made: list[Path]) -> None:
    """Create ``directory`` and the missing ones above it, recording each one created in ``made`` (outermost
    first); OSError when one cannot be made."""
    missing = [d for d in [directory, *directory.parents] if not os.path.lexists(d)]
    for new in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another process: its, not ours
            new.mkdir()
            made.append(new)


def remove_empty(directories: list[Path]) -> None:
    """Remove each of ``directories`` (outermost first, as ``make_dirs`` records them) that is empty, innermost
    first; one that is not empty (or gone) stays as it is."""
    for directory in reversed(directories):
        with contextlib.suppress(OSError):
            directory.rmdir()


def _own_stream(value: str) -> str:
    """``"output"`` or ``"error"`` when ``value`` names the file or pipe this process's standard output or error
    goes to (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``, or that file by name), by device and inode; "" for
    anything else, a character device (a terminal, /dev/null) included."""
    try:
        given = os.stat(value)
    except (OSError, ValueError):
        return ""
    if stat.S_ISCHR(given.st_mode):  # a terminal or /dev/null: lines mix harmlessly or vanish
        return ""
    for name, stream in (("output", sys.stdout), ("error", sys.stderr)):
        try:
            out = os.fstat(stream.fileno())
        except (OSError, ValueError, AttributeError):  # a stream without a descriptor (captured)
            continue
        if (given.st_dev, given.st_ino) == (out.st_dev, out.st_ino):
            return name
    return ""


def _resolved(key: str, value: str) -> Path:
    given = Path(value)
    if given.is_symlink() and not given.exists():
        target = os.readlink(given)
        if os.path.lexists(given.parent / target):  # the target is there: a link that leads back to itself
            raise ValueError(f"{key}={value}: a symlink loop (through {target})")
        raise ValueError(f"{key}={value}: a dangling symlink (its target {target} does not exist)")
    return given.resolve() if given.is_symlink() else given


def _check_not_input(key: str, value: str, path: Path, inputs: dict[str, str]) -> None:
    """ValueError when ``path`` is an input, or an existing file inside an input directory (a model's weights)."""
    for other_key, other in inputs.items():
        if other and _same_file(path, Path(other)):
            kind = "directory" if path.is_dir() else "file"
            raise ValueError(f"{key}={value} is the {other_key} {kind}: writing it would destroy the input")
        if other and path.is_file() and _contains(Path(other), path):
            raise ValueError(f"{key}={value} is a file of the {other_key} directory {other}: writing would destroy it")


def check_creatable(key: str, value: str) -> None:
    """ValueError naming ``key`` unless the directory ``value`` exists or can be made, and takes new files: its
    nearest existing ancestor is a directory where a file can be created (tried for real). Nothing is made: for a
    directory another tool creates (Hydra's run directory)."""
    ancestor = _existing_ancestor(Path(value))
    if not ancestor.is_dir():
        raise ValueError(f"{key}={value}: {ancestor} is not a directory")
    _probe_directory(key, value, ancestor)


def _make_parent(key: str, value: str, path: Path) -> tuple[Path, ...]:
    """Create the directories above a new output (ValueError naming the key when that is impossible) and check
    that the nearest one takes new files; the directories created (outermost first; removed again on an error)."""
    parent = _existing_ancestor(path.parent)
    if not parent.is_dir():
        raise ValueError(f"{key}={value}: {parent} is not a directory")
    made: list[Path] = []
    try:
        make_dirs(path.parent, made)
        _probe_directory(key, value, path.parent)
    except OSError as err:
        remove_empty(made)
        raise ValueError(f"{key}={value}: cannot create its directory ({err.strerror})") from None
    except ValueError:
        remove_empty(made)
        raise
    return tuple(made)


def _probe_directory(key: str, value: str, directory: Path) -> None:
    """ValueError unless a file can be created in ``directory`` (tried for real: permission bits lie to root)."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as err:
        raise ValueError(f"{key}={value}: cannot create files in {directory} ({err.strerror})") from None


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def _contains(directory: Path, inner: Path) -> bool:
    """Whether ``inner`` lies strictly inside the existing directory ``directory``."""
    if not directory.is_dir():
        return False
    outer, inside = directory.resolve(), inner.resolve()
    return outer != inside and outer in inside.parents


def _existing_ancestor(directory: Path) -> Path:
    """The nearest ancestor of ``directory`` (itself included) that exists: where new directories would be made."""
    current = directory.absolute()
    while not current.exists() and current != current.parent:
        current = current.parent
    return current
