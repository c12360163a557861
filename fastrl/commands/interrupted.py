"""What a command says when it is interrupted (Ctrl-C, SIGTERM): what it kept and how to go on."""

from __future__ import annotations

import sys


def say_interrupted(err: KeyboardInterrupt, message: str) -> KeyboardInterrupt:
    """Print ``message`` to stderr and mark ``err`` as said (the CLI then adds no line of its own); returns it to
    re-raise (``raise say_interrupted(err, ...) from None`` keeps the traceback short)."""
    print(message, file=sys.stderr, flush=True)
    err.reported = True
    return err
