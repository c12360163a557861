"""A directory output written all at once: files are written into a staging directory beside it, then renamed into
place, all of them or none (``staged_directory``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from fastrl.atomic_files import no_space
from fastrl.commands.output_guard import OutputTarget, make_dirs, remove_empty
from fastrl.interrupts import held_interrupts


@contextlib.contextmanager
def staged_directory(target: OutputTarget, owned: tuple[str, ...] = ()) -> Iterator[Path]:
    """A temporary directory beside ``target`` to write into. When the block ends without an error its files go into
    ``target`` (created if needed; files of the same name replaced, others kept, except the ``owned`` names this
    write did not produce: an earlier write's, removed), all of them or none: every path is checked before the first
    rename (a directory where a file goes is refused), and a rename that fails puts back what the ones before it
    replaced; either is one ValueError naming the key and the path, ``target`` left as it was. When the block
    raises, the staging directory is removed and ``target`` is untouched (and so are the directories above it: the
    ones this made for the staging directory are removed again)."""
    final = target.path
    made: list[Path] = []
    make_dirs(final.parent, made)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        try:
            yield staging
        except OSError as err:
            raise no_space(err, f"into {final}; its files are left as they were") from None
        produced = {item.name for item in staging.iterdir()}
        files = sorted(p.relative_to(staging) for p in staging.rglob("*") if not p.is_dir())
        removed = [Path(name) for name in sorted(set(owned) - produced) if os.path.lexists(final / name)]
        _check_replaceable(target, files, removed)
        _replace_all(target, staging, files, removed)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        remove_empty(made)


def _check_replaceable(target: OutputTarget, files: list[Path], removed: list[Path]) -> None:
    """ValueError naming the key and the path when a staged file (``files``, relative) or an earlier file to remove
    (``removed``) meets a directory in ``target``, or a staged file's directory meets a file: nothing is renamed."""
    final = target.path
    for rel in [*files, *removed]:
        dest = final / rel
        if dest.is_dir() and not dest.is_symlink():
            what = "writes a file" if rel in files else "removes an earlier export's file"
            raise ValueError(
                f"{target.key}={target.given}: {dest} is a directory where this command {what}; remove it or "
                f"choose another output ({final} is left as it was)"
            )
        for parent in list(rel.parents)[:-1]:
            if os.path.lexists(final / parent) and not (final / parent).is_dir():
                raise ValueError(
                    f"{target.key}={target.given}: {final / parent} is a file where this command writes a directory; "
                    f"remove it or choose another output ({final} is left as it was)"
                )


def _replace_all(target: OutputTarget, staging: Path, files: list[Path], removed: list[Path]) -> None:
    """Rename the staged ``files`` into ``target`` and the ``removed`` ones out of it, each replaced file first moved
    to a backup directory beside it; when a rename fails, every step done is undone (``_undo``) and a ValueError
    names the key and the file."""
    final = target.path
    backup = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".old"))
    journal: list[tuple[Path, Path | None]] = []  # (a path of target, where its earlier file is; None: it had none)
    made: list[Path] = []  # directories this write created, in order
    staged, keep_backup, complete = set(files), False, False
    try:
        # an interrupt waits for the renames (a Ctrl-C between two left one file of the old output, one of neither)
        with held_interrupts(f"writing {target.key}", raising_only=True):
            make_dirs(final, made)
            for rel in [*files, *removed]:
                dest = final / rel
                make_dirs(dest.parent, made)
                journal.append((dest, _move_aside(dest, backup, len(journal))))
                if rel in staged:
                    os.replace(staging / rel, dest)
            complete = True  # a signal held to here is delivered as the block ends: the new output stays
    except OSError as err:
        stuck = _undo(journal, made)
        keep_backup = bool(stuck)
        left = f"{final} is left as it was" if not stuck else f"{stuck} could not be put back: they are in {backup}"
        raise ValueError(
            f"{target.key}={target.given}: cannot write {err.filename or final} ({err.strerror or err}); {left}"
        ) from None
    except BaseException:  # a second Ctrl-C (the user insists) mid-renames, another error: the old output comes back
        if not complete:
            keep_backup = bool(_undo(journal, made))
        raise
    finally:
        if not keep_backup:
            shutil.rmtree(backup, ignore_errors=True)


def _move_aside(dest: Path, backup: Path, index: int) -> Path | None:
    """Move the file at ``dest`` (if any) into ``backup`` as ``index``; where it went, or None when there was none."""
    if not os.path.lexists(dest):
        return None
    saved = backup / str(index)
    os.replace(dest, saved)
    return saved


def _undo(journal: list[tuple[Path, Path | None]], made: list[Path]) -> list[str]:
    """Put back what ``_replace_all`` did, last step first: each earlier file to its path, each new file removed,
    each directory it created removed. The paths that could not be put back (empty when all were)."""
    stuck = []
    for dest, saved in reversed(journal):
        try:
            if saved is None:
                dest.unlink(missing_ok=True)
            else:
                os.replace(saved, dest)
        except OSError:
            stuck.append(str(dest))
    remove_empty(made)
    return stuck
