"""Ctrl-C and SIGTERM wait for the end of a training step once the step has started to change the policy.

A step's rollout can be interrupted at any moment (nothing has changed since the last step), but an interrupt inside
the policy update would leave the weights, the optimizer and the rollout workers between two steps, where no
consistent checkpoint exists. Inside :func:`step_boundary` the first interrupt is held and raised when the block
ends, so the trainer stands between two steps with its metrics logged; a second interrupt stops at once. A signal
the process ignores (``SIG_IGN``, as inherited by ``cmd &`` in a non-interactive shell) stays ignored inside the block
as outside it.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

LOG = logging.getLogger("fastrl.train")
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def step_boundary() -> Iterator[None]:
    """Hold SIGINT/SIGTERM for the block and raise ``KeyboardInterrupt`` at its end if one came (a second signal
    raises at once); an ignored one is left ignored. Outside the main thread, where Python cannot install handlers,
    the block runs unprotected."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if held:
            raise KeyboardInterrupt(f"signal {signum} (again, inside a policy update)")
        held.append(signum)
        LOG.warning("interrupt received: finishing this step's policy update first (interrupt again to stop now)")

    held_here = [number for number in HELD_SIGNALS if signal.getsignal(number) != signal.SIG_IGN]
    previous = {number: signal.signal(number, hold) for number in held_here}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if held:
        raise KeyboardInterrupt(f"signal {held[0]} (held to the end of the step)")
