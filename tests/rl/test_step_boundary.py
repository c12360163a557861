"""Interrupts inside a training step's policy update wait for the step's end; a second one stops at once."""

import os
import signal

import pytest

from fastrl.rl.step_boundary import step_boundary


def _interrupt() -> None:
    os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_inside_the_block_is_raised_when_the_block_ends(number):
    done = []
    before = signal.getsignal(number)
    with pytest.raises(KeyboardInterrupt, match="held to the end of the step"):
        with step_boundary():
            os.kill(os.getpid(), number)
            done.append("update finished")
    assert done == ["update finished"]
    assert signal.getsignal(number) is before


def test_a_second_interrupt_stops_at_once():
    done = []
    with pytest.raises(KeyboardInterrupt, match="again, inside the step"):
        with step_boundary():
            _interrupt()
            done.append("first held")
            _interrupt()
            done.append("never reached")
    assert done == ["first held"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_quiet_block_raises_nothing_and_an_error_inside_is_kept():
    with step_boundary():
        pass
    with pytest.raises(ValueError, match="boom"):
        with step_boundary():
            raise ValueError("boom")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_an_ignored_signal_stays_ignored_inside_the_block(number):
    """A process started with SIGINT ignored (``cmd &`` in a non-interactive shell) ignores it throughout, a policy
    update and a checkpoint write included (it was honoured only there, with exit 130)."""
    before = signal.signal(number, signal.SIG_IGN)
    try:
        done = []
        with step_boundary():
            assert signal.getsignal(number) == signal.SIG_IGN
            os.kill(os.getpid(), number)
            done.append("update finished")
        assert done == ["update finished"] and signal.getsignal(number) == signal.SIG_IGN
    finally:
        signal.signal(number, before)


def test_the_cli_keeps_an_inherited_ignored_sigterm_ignored(monkeypatch):
    """`fastrl` turns SIGTERM into an unwinding interrupt while a command runs, unless the process inherited it as
    ignored: then it stays ignored for the whole command (and the handler is put back after it either way)."""
    import fastrl.cli as cli

    seen = []

    def command(overrides: list[str]) -> int:
        seen.append(signal.getsignal(signal.SIGTERM))
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: the command goes on
        return 0

    monkeypatch.setattr(cli, "commands", lambda: {"train": command})
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        assert cli.main(["train"]) == 0 and seen == [signal.SIG_IGN]
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        seen.clear()

        def interrupted(overrides: list[str]) -> int:
            seen.append(signal.getsignal(signal.SIGTERM))
            os.kill(os.getpid(), signal.SIGTERM)  # unwinds like Ctrl-C: exit 130
            return 0

        monkeypatch.setattr(cli, "commands", lambda: {"train": interrupted})
        assert cli.main(["train"]) == 130 and seen == [cli._terminate]
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)
