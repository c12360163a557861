"""The kernel cache: a library there is loaded only when it is a regular file whose size and sha256 are those its
sidecar recorded at the build; anything else (a truncated copy, which crashed every run with SIGBUS; a FIFO, which
hung dlopen; a library from before the sidecars) is built again, and a library that does not load is built again
once rather than falling back to PyTorch on every run."""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import pytest

from fastrl.models import kernel_build
from fastrl.models.kernel_build import load_kernel

KERNEL = "uniform_bits"  # the quickest to build


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty kernel cache whose loads are recorded; a load of anything but a whole regular file fails the test
    (rather than crashing or hanging the process, as a real load of one does)."""
    monkeypatch.setenv("FASTRL_CACHE", str(tmp_path))
    loaded: list[Path] = []
    real = ctypes.CDLL

    def checked(path: str) -> ctypes.CDLL:
        library = Path(path)
        assert library.is_file(), f"dlopen of {library}, not a regular file, blocks"
        sidecar = library.with_name(library.name + ".sum")
        assert sidecar.is_file() and int(sidecar.read_text().split()[0]) == library.stat().st_size, "truncated"
        loaded.append(library)
        return real(path)

    monkeypatch.setattr(kernel_build.ctypes, "CDLL", checked)
    load_kernel.cache_clear()
    yield tmp_path / "kernels", loaded
    load_kernel.cache_clear()


def _built(kernels: Path) -> tuple[Path, Path]:
    """The built library and its sidecar."""
    (library,) = kernels.glob(f"{KERNEL}-*.so")
    return library, library.with_name(library.name + ".sum")


def _load_again() -> ctypes.CDLL | None:
    load_kernel.cache_clear()
    return load_kernel(KERNEL)


def test_a_truncated_library_is_built_again_not_loaded(cache):
    kernels, loaded = cache
    assert load_kernel(KERNEL) is not None
    library, _ = _built(kernels)
    whole = library.read_bytes()
    library.write_bytes(whole[:6000])  # an interrupted copy of the cache
    assert _load_again() is not None
    assert library.read_bytes() == whole and loaded == [library, library]


def test_a_fifo_at_the_library_is_replaced_not_opened(cache):
    kernels, loaded = cache
    assert load_kernel(KERNEL) is not None
    library, _ = _built(kernels)
    library.unlink()
    os.mkfifo(library)
    assert _load_again() is not None
    assert library.is_file() and loaded == [library, library]


def test_a_library_without_a_sidecar_is_built_again_once(cache):
    kernels, _ = cache
    assert load_kernel(KERNEL) is not None
    library, sidecar = _built(kernels)
    sidecar.unlink()  # a library built before the sidecars
    assert _load_again() is not None
    assert sidecar.is_file()
    stamp = library.stat().st_mtime_ns
    assert _load_again() is not None
    assert library.stat().st_mtime_ns == stamp


def test_a_library_that_does_not_load_is_built_again_once(cache, monkeypatch, caplog):
    kernels, _ = cache
    checked = kernel_build.ctypes.CDLL
    monkeypatch.setattr(kernel_build.ctypes, "CDLL", str)  # built, not loaded: dlopen would hand the same path back
    assert load_kernel(KERNEL) is not None
    monkeypatch.setattr(kernel_build.ctypes, "CDLL", checked)
    library, sidecar = _built(kernels)
    garbage = b"not an ELF library"
    library.write_bytes(garbage)
    sidecar.write_text(kernel_build._summary(garbage), encoding="ascii")  # whole, as recorded, yet no library
    with caplog.at_level(logging.WARNING):
        assert _load_again() is not None
    assert "falling back" not in caplog.text and library.read_bytes() != garbage
    builds: list[Path] = []
    monkeypatch.setattr(kernel_build, "_build", lambda *args: builds.append(args[-1]) or _failing_build())
    monkeypatch.setattr(kernel_build.ctypes, "CDLL", _unloadable)
    with caplog.at_level(logging.WARNING):
        assert _load_again() is None
    assert builds == [library] and f"loading {library} failed, falling back to PyTorch" in caplog.text


def _unloadable(path: str) -> None:
    """dlopen of a file that is no library."""
    raise OSError(f"{path}: invalid ELF header")


def _failing_build(*args: object) -> None:
    """A build that fails (a compiler gone since)."""
    raise OSError("no compiler")
