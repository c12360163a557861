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


def test_a_held_signal_reaches_the_callers_handler_when_the_block_raises():
    """A script's graceful-stop flag, set by a SIGTERM that came inside a block which then raised an ordinary
    error: the exception left the block before the held signal was delivered, and the flag was never set."""
    calls: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        with pytest.raises(ValueError, match="a fault in the block"):
            with held_interrupts("the test", raising_only=True):
                os.kill(os.getpid(), signal.SIGTERM)
                assert calls == []
                raise ValueError("a fault in the block")
        assert calls == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_blocks_error_goes_on_unchanged_noted_with_the_held_sigint():
    """A fault and a Ctrl-C in one block: the fault is what the caller catches (an undo that catches OSError still
    runs, the user reads the fault), and its notes say the signal came."""
    with pytest.raises(OSError, match="disk full") as caught:
        with held_interrupts("the test", raising_only=True):
            os.kill(os.getpid(), signal.SIGINT)
            raise OSError(28, "disk full")
    assert caught.value.__notes__ == ["signal 2 came during the test; this error stopped it first"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_callers_raising_handler_does_not_replace_the_blocks_error():
    """The CLI's SIGTERM handler raises KeyboardInterrupt: heard, it must not hide the error the block raised."""
    calls: list[int] = []

    def raising(signum, frame):
        calls.append(signum)
        raise KeyboardInterrupt("terminated")

    before = signal.signal(signal.SIGTERM, raising)
    try:
        with pytest.raises(RuntimeError, match="a fault"):
            with held_interrupts("the test", raising_only=True):
                os.kill(os.getpid(), signal.SIGTERM)
                raise RuntimeError("a fault")
        assert calls == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_block_that_stops_with_an_interrupt_raises_only_that():
    with pytest.raises(KeyboardInterrupt, match="^the block's own$") as caught:
        with held_interrupts("the test", raising_only=True):
            os.kill(os.getpid(), signal.SIGINT)
            raise KeyboardInterrupt("the block's own")
    assert caught.value.__cause__ is None and caught.value.__context__ is None


def test_two_signals_stop_nested_blocks_at_once():
    """Blocks nest (``Engine.drop`` steps the engine inside its own hold): the inner block's second signal went to
    the outer block's hold, which held it as its first, and only a third one stopped."""
    seen = []
    with pytest.raises(KeyboardInterrupt, match=r"signal 2 \(again, inside the inner block\)"):
        with held_interrupts("the outer block", raising_only=True):
            with held_interrupts("the inner block", raising_only=True):
                os.kill(os.getpid(), signal.SIGINT)
                seen.append("first held")
                os.kill(os.getpid(), signal.SIGINT)
                seen.append("never reached")
    assert seen == ["first held"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_signal_held_by_an_outer_block_makes_the_inner_blocks_first_one_a_second():
    seen = []
    with pytest.raises(KeyboardInterrupt, match="again, inside the inner block"):
        with held_interrupts("the outer block", raising_only=True):
            os.kill(os.getpid(), signal.SIGINT)
            seen.append("first held")
            with held_interrupts("the inner block", raising_only=True):
                os.kill(os.getpid(), signal.SIGINT)
                seen.append("never reached")
    assert seen == ["first held"]


def test_an_inner_blocks_held_signal_waits_for_the_outer_blocks_end():
    seen = []
    with pytest.raises(KeyboardInterrupt, match="held to the end of the outer block"):
        with held_interrupts("the outer block", raising_only=True):
            with held_interrupts("the inner block", raising_only=True):
                os.kill(os.getpid(), signal.SIGINT)
            seen.append("outer block goes on")
    assert seen == ["outer block goes on"]
