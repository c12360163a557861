"""A rollout worker's error in one line (Ray-free: the local backend's drafter rounds say them too)."""

from __future__ import annotations


def short_error(err: BaseException) -> str:
    """The last meaningful line of an error, ``"<Type>: <message>"``: of a Ray task error, that of the remote
    exception it carries (``cause``), not of the traceback Ray wraps it in."""
    cause = getattr(err, "cause", None)
    if not isinstance(cause, BaseException):
        cause = err  # a local error: said with its type, as a remote one is
    text = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__
