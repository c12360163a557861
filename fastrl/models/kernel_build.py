"""Builds fastrl's CPU kernels (C++ under fastrl/models/kernels) at first use and loads them with ctypes.

The source is compiled with the system's C++ compiler (`$CXX`, else g++, else c++) for the machine it runs on
(`-O3 -march=native`), once: the library is kept under `$FASTRL_CACHE/kernels` (default ~/.cache/fastrl/kernels),
named by a hash of the source (and of the headers the kernels share), the compiler's version, the flags and the
CPU's model and features, so a cache shared by other machines never hands one a library built for another CPU.
Concurrent builds (Ray workers) are safe: each compiles to its own temporary file and renames it into place. Where
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
    if not library.exists():
        try:
            _build(compiler, source, headers, name, library)
        except (OSError, subprocess.SubprocessError) as error:
            LOG.warning("fastrl: building the %s kernel failed, falling back to PyTorch: %s", name, error)
            return None
    try:
        return ctypes.CDLL(str(library))
    except OSError as error:
        LOG.warning("fastrl: loading %s failed, falling back to PyTorch: %s", library, error)
        return None


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
        os.replace(out, library)
