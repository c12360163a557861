"""Interrupts (SIGINT, SIGTERM) held to the end of a block that must not stop half way.

Python delivers a signal as an exception between any two bytecodes, so a block that changes two things that must
agree (a policy and its optimizer; an engine's device state and its requests' tokens) can be left between them.
Inside :func:`held_interrupts` the first such signal is recorded and delivered when the block ends (to the handler
it found, or as ``KeyboardInterrupt``; a block that ends with an error raises that error, noted with the signal,
which the caller's own handler still hears of); a second one is delivered at once
(the user insists), also when the first is held by an enclosing block. Python runs signal handlers in the main
thread only, so elsewhere the block runs unprotected.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Hold:
    """The handler a held block installs: it records the first signal and passes a second one on at once.

    ``previous`` maps each signal it replaced to the handler it found there, which is another block's ``_Hold``
    when the blocks nest: the signals held anywhere in the nest count together (two stop at once, not three)."""

    def __init__(self, where: str, on_first: Callable[[int], None] | None) -> None:
        self.where = where
        self.on_first = on_first
        self.held: list[int] = []
        self.previous: dict[int, object] = {}

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.holding():
            self.insist(signum, frame, f"again, inside {self.where}")
            return
        self.held.append(signum)
        if self.on_first is not None:
            self.on_first(signum)

    def holding(self) -> bool:
        """Whether this block, or a block it is nested in, holds a signal already."""
        return bool(self.held) or any(isinstance(h, _Hold) and h.holding() for h in self.previous.values())

    def insist(self, signum: int, frame: FrameType | None, message: str) -> None:
        """Deliver a signal at once, past every enclosing block's hold, to the handler the outermost one found."""
        outer = self.previous.get(signum)
        if isinstance(outer, _Hold):
            outer.insist(signum, frame, message)
        else:
            self.deliver(signum, frame, message)

    def deliver(self, signum: int, frame: FrameType | None, message: str) -> None:
        """Deliver a signal to the handler found (an enclosing block's hold then holds it in turn), or as
        ``KeyboardInterrupt`` where that was Python's default."""
        handler = self.previous.get(signum)
        if callable(handler) and handler is not signal.default_int_handler:
            handler(signum, frame)  # the caller's own handler (the CLI's raises KeyboardInterrupt itself)
        else:
            raise KeyboardInterrupt(f"signal {signum} ({message})")

    def deliver_after(self, error: BaseException) -> None:
        """The held signal, when the block raised ``error``: the error goes on unchanged (the caller's recovery, an
        undo that catches ``OSError``, and the message the user reads are the error's), noted with the signal; the
        handler found still hears of it (a graceful-stop flag must not be lost), and one that raises (the CLI's
        ``KeyboardInterrupt``) does not replace the error. A block that stops with an interrupt (or an exit) says
        the same already: nothing is added."""
        if not isinstance(error, Exception):
            return
        signum = self.held[0]
        error.add_note(f"signal {signum} came during {self.where}; this error stopped it first")
        handler = self.previous.get(signum)
        if callable(handler) and handler is not signal.default_int_handler:
            try:
                handler(signum, None)
            except KeyboardInterrupt:
                pass  # the error propagating stops the caller as the interrupt would

    def install(self, raising_only: bool) -> None:
        """Put this hold in place of the handlers of ``HELD_SIGNALS``, but where a signal is ignored, not Python's to
        change, or (``raising_only``) ends the process (``SIG_DFL``): those are left as they are."""
        for number in HELD_SIGNALS:
            before = signal.getsignal(number)
            if before == signal.SIG_IGN or before is None or (raising_only and not callable(before)):
                continue
            self.previous[number] = signal.signal(number, self)

    def restore(self) -> None:
        """Put back the handlers this hold replaced."""
        for number, handler in self.previous.items():
            signal.signal(number, handler)


@contextmanager
def held_interrupts(
    where: str, raising_only: bool = False, on_first: Callable[[int], None] | None = None
) -> Iterator[None]:
    """Hold SIGINT/SIGTERM for the block and deliver the first that came at its end: to the handler it found when
    that is the caller's own (a script's graceful-stop flag runs, late but once), else as
    ``KeyboardInterrupt("signal N (held to the end of <where>)")``; a second signal is delivered at once (the
    user insists), also when the first is held by an enclosing block (`held_interrupts` nests). When the block
    raises an error, the error propagates unchanged, noted with the held signal, which still reaches the caller's own
    handler (a handler that raises ``KeyboardInterrupt`` does not replace the error); a block that stops with an
    interrupt already raises only that. An
    ignored signal stays ignored. ``raising_only``: hold only signals whose handler is Python code
    (``KeyboardInterrupt`` for SIGINT, the CLI's for SIGTERM), leaving a signal that ends the process (``SIG_DFL``)
    as it is. ``on_first`` hears of the first signal (e.g. to log it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hold = _Hold(where, on_first)
    hold.install(raising_only)
    try:
        yield
    except BaseException as error:
        hold.restore()
        if hold.held:
            hold.deliver_after(error)
        raise
    hold.restore()
    if hold.held:
        hold.deliver(hold.held[0], None, f"held to the end of {where}")
