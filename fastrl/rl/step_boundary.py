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
from collections.abc import Iterator
from contextlib import contextmanager

from fastrl.interrupts import held_interrupts

LOG = logging.getLogger("fastrl.train")


@contextmanager
def step_boundary() -> Iterator[None]:
    """Hold SIGINT/SIGTERM for the block and raise ``KeyboardInterrupt`` at its end if one came (a second signal
    raises at once); an ignored one is left ignored. Outside the main thread, where Python cannot install handlers,
    the block runs unprotected."""

    def warn(signum: int) -> None:
        LOG.warning("interrupt received: finishing this step's policy update first (interrupt again to stop now)")

    with held_interrupts("the step", on_first=warn):
        yield
