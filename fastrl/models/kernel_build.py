"""Builds fastrl's CPU kernels (C++ under fastrl/models/kernels) at first use and loads them with ctypes.

The source is compiled with the system's C++ compiler (`$CXX`, else g++, else c++) for the machine it runs on
(`-O3 -march=native`), once: the library is kept under `$FASTRL_CACHE/kernels` (default ~/.cache/fastrl/kernels),
named by a hash of the source (and of the headers the kernels share), the compiler's version, the flags and the
CPU's model and features, so a cache shared by other machines never hands one a library built for another CPU.
Concurrent builds (Ray workers) are safe: each compiles to its own temporary file and renames it into place, with a
sidecar (`<library>.sum`: its size and sha256) checked before every load, so a truncated or foreign file there (a
FIFO, an interrupted copy of a cache, a library from before the sidecars) is built again rather than loaded. Where
no compiler is found or the build fails, the loader says why once (a warning) and returns None; callers fall back to
PyTorch.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from fastrl.models.named import cache_root

LOG = logging.getLogger(__name__)
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-shared", "-fPIC", "-std=c++17")
"""`-ffp-contract=off`: every product and sum as written, never fused into an FMA where the compiler sees fit. With
contraction the compiler chose differently between a kernel's instances (the small-row product's one-row pass and
its sixteen-row pass on a CPU with FMA but not AVX2), and a row's result then depended on how many rows came with
it."""
BUILD_TIMEOUT_S = 300


def _cpu_identity() -> str:
    """The CPU's model and feature flags (what -march=native compiles for)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform

        return platform.processor() or platform.machine()
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({line for line in lines if line.split(":")[0].strip() in wanted}))


def _compiler() -> str | None:
    found = (shutil.which(name) for name in (os.environ.get("CXX"), "g++", "c++") if name)
    return next((path for path in found if path), None)


@functools.cache
def load_kernel(name: str) -> ctypes.CDLL | None:
    """The compiled library of `fastrl/models/kernels/<name>.cpp`, built on first use; None (and one warning) when
    it cannot be built here."""
    kernels = resources.files("fastrl.models").joinpath("kernels")
    source = kernels.joinpath(f"{name}.cpp").read_bytes()
    headers = {item.name: item.read_bytes() for item in kernels.iterdir() if item.name.endswith(".h")}
    compiler = _compiler()
    if compiler is None:
        LOG.warning("fastrl: no C++ compiler (set CXX, or install g++): %s falls back to PyTorch", name)
        return None
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as error:
        LOG.warning("fastrl: %s --version failed (%s): %s falls back to PyTorch", compiler, error, name)
        return None
    parts = [source, *(headers[h] for h in sorted(headers)), version.encode(), " ".join(FLAGS).encode()]
    key = hashlib.sha256(b"\0".join([*parts, _cpu_identity().encode()]))
    directory = cache_root() / "kernels"
    library = directory / f"{name}-{key.hexdigest()[:20]}.so"
    build = functools.partial(_build_or_warn, compiler, source, headers, name, library)
    if _intact(library):
        return _load(library, rebuild=build)
    return _load(library, rebuild=None) if build() else None


def _load(library: Path, rebuild: Callable[[], bool] | None) -> ctypes.CDLL | None:
    """``ctypes.CDLL`` of ``library``; where it does not load, ``rebuild`` (when given) and one more try, so that a
    damaged library is built again once rather than falling back to PyTorch on every run; None and a warning naming
    the file when it still does not load."""
    try:
        return ctypes.CDLL(str(library))
    except OSError as error:
        if rebuild is None or not rebuild():
            LOG.warning("fastrl: loading %s failed, falling back to PyTorch: %s", library, error)
            return None
    return _load(library, rebuild=None)


def _build_or_warn(compiler: str, source: bytes, headers: dict[str, bytes], name: str, library: Path) -> bool:
    """``_build``; False (and a warning naming the library) when it fails."""
    try:
        _build(compiler, source, headers, name, library)
    except (OSError, subprocess.SubprocessError) as error:
        LOG.warning("fastrl: building the %s kernel failed, falling back to PyTorch (%s): %s", name, library, error)
        return False
    return True


def _sidecar(library: Path) -> Path:
    """Where the size and sha256 of ``library`` are kept, beside it."""
    return library.with_name(library.name + ".sum")


def _summary(data: bytes) -> str:
    """What the sidecar of a library holding ``data`` says: its size and sha256."""
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}\n"


def _intact(library: Path) -> bool:
    """Whether ``library`` is a regular file whose size and sha256 are those its sidecar recorded when it was
    built. A truncated library (an interrupted copy of a cache) crashed the process with SIGBUS when loaded, a FIFO
    there hung it in dlopen, and a library from before the sidecars has none: each is built again."""
    sidecar = _sidecar(library)
    try:
        if not (library.is_file() and sidecar.is_file()):  # before opening either: a FIFO blocks the open
            return False
        return sidecar.read_text(encoding="ascii") == _summary(library.read_bytes())
    except (OSError, UnicodeDecodeError):
        return False


def _build(compiler: str, source: bytes, headers: dict[str, bytes], name: str, library: Path) -> None:
    """Compiles `source` (beside the kernels' shared `headers`) into `library` (through a temporary file renamed
    into place)."""
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as work:
        for header, text in headers.items():
            (Path(work) / header).write_bytes(text)
        src = Path(work) / f"{name}.cpp"
        src.write_bytes(source)
        out = Path(work) / library.name
        done = subprocess.run(
            [compiler, *FLAGS, "-o", str(out), str(src)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
        )
        if done.returncode != 0:
            raise subprocess.SubprocessError(f"{compiler} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        summary = Path(work) / "summary"
        summary.write_text(_summary(out.read_bytes()), encoding="ascii")
        os.replace(summary, _sidecar(library))  # an interruption between the two leaves a mismatch: built again
        os.replace(out, library)
