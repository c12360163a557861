"""Interrupts (SIGINT, SIGTERM) held to the end of a block that must not stop half way.

Python delivers a signal as an exception between any two bytecodes, so a block that changes two things that must
agree (a policy and its optimizer; an engine's device state and its requests' tokens) can be left between them.
Inside :func:`held_interrupts` the first such signal is recorded and delivered when the block ends (to the handler
it found, or as ``KeyboardInterrupt``); a second one is delivered at once (the user insists). Python runs signal
handlers in the main thread only, so elsewhere the block runs unprotected.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def held_interrupts(
    where: str, raising_only: bool = False, on_first: Callable[[int], None] | None = None
) -> Iterator[None]:
    """Hold SIGINT/SIGTERM for the block and deliver the first that came at its end: to the handler it found when
    that is the caller's own (a script's graceful-stop flag runs, late but once), else as
    ``KeyboardInterrupt("signal N (held to the end of <where>)")``; a second signal is delivered at once (the
    user insists). An ignored signal stays ignored. ``raising_only``: hold only signals whose handler is Python code
    (``KeyboardInterrupt`` for SIGINT, the CLI's for SIGTERM), leaving a signal that ends the process (``SIG_DFL``)
    as it is. ``on_first`` hears of the first signal (e.g. to log it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous: dict[int, object] = {}

    def deliver(signum: int, frame: FrameType | None, message: str) -> None:
        handler = previous.get(signum)
        if callable(handler) and handler is not signal.default_int_handler:
            handler(signum, frame)  # the caller's own handler (the CLI's raises KeyboardInterrupt itself)
        else:
            raise KeyboardInterrupt(f"signal {signum} ({message})")

    def hold(signum: int, frame: FrameType | None) -> None:
        if held:
            deliver(signum, frame, f"again, inside {where}")
            return
        held.append(signum)
        if on_first is not None:
            on_first(signum)

    for number in HELD_SIGNALS:
        before = signal.getsignal(number)
        if before == signal.SIG_IGN or before is None or (raising_only and not callable(before)):
            continue  # ignored, not Python's to change, or (raising_only) one that ends the process: left as it is
        previous[number] = signal.signal(number, hold)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if held:
        deliver(held[0], None, f"held to the end of {where}")
