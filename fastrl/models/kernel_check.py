"""A GPU kernel's check at engine start: run it, and say once why the engine goes on without the kernel."""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def passes_check(what: str, check: Callable[[], str | None], fallback: str) -> bool:
    """True when `check` (the kernel against PyTorch: what differs, or None) passes. Otherwise one warning naming
    `what` failed, why, and the `fallback` taken, and False; an exception (a compiler or driver that cannot build
    the kernel) is a failure too, since the portable path still works."""
    try:
        error = check()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    if error is not None:
        log.warning("%s failed the check against PyTorch (%s): %s", what, error, fallback)
        return False
    return True
