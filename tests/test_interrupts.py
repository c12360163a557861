"""``held_interrupts`` defers a signal, it does not replace its handler: a script's own SIGTERM handler (a graceful
stop flag) was swapped for a KeyboardInterrupt inside every engine step; now it runs once, at the block's end (at once
for a second signal), and SIGINT's default handler still ends the block with a KeyboardInterrupt."""

from __future__ import annotations

import os
import signal

import pytest

from fastrl.interrupts import held_interrupts


@pytest.mark.parametrize("raising_only", [False, True])
def test_a_callers_own_handler_runs_at_the_end_of_the_block(raising_only):
    calls: list[tuple[int, str]] = []
    done: list[str] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append((signum, "after" if done else "inside")))
    try:
        with held_interrupts("the test", raising_only=raising_only):
            os.kill(os.getpid(), signal.SIGTERM)
            assert calls == []  # held
            done.append("block")
        assert calls == [(signal.SIGTERM, "after")]
        with held_interrupts("the test", raising_only=raising_only):
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # a second one goes through at once
            assert len(calls) == 2
        assert len(calls) == 3
    finally:
        signal.signal(signal.SIGTERM, before)


def test_sigint_ends_the_block_with_a_keyboard_interrupt():
    done = []
    with pytest.raises(KeyboardInterrupt, match=r"signal 2 \(held to the end of the test\)"):
        with held_interrupts("the test", raising_only=True):
            os.kill(os.getpid(), signal.SIGINT)
            done.append("block")
    assert done == ["block"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
