"""An interrupted or disk-full `fastrl generate` keeps stats of exactly the results it wrote: an interrupt that
came as the engine's step returned lost the step's outputs, and the ledger kept that round whole (rows of requests
not written were counted again by the resumed run); a disk-full stop wrote no stats at all."""

from __future__ import annotations

import errno
import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

import fastrl.commands.generate as generate_module
from fastrl.cli import main
from fastrl.commands.result_stream import ResultStream
from fastrl.commands.round_ledger import RoundLedger
from fastrl.engine.engine import Engine
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import Strategy
from tests.cli.test_generate_interrupted_stats import _args
from tests.helpers import make_hf_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A saved tiny random HF Llama; tests only read it."""
    path = tmp_path_factory.mktemp("tiny")
    make_hf_model("llama").save_pretrained(path)
    return path


def _round(emitted: list[int]) -> RoundStats:
    n = len(emitted)
    return RoundStats(
        strategy=Strategy.parse("suffix_8"),
        batch_size=n,
        drafted_tokens=[8] * n,
        accepted_tokens=[e - 1 for e in emitted],
        emitted_tokens=emitted,
        wall_time_s=0.1,
        draft_time_s=0.01,
        verify_time_s=0.05,
        plain_time_estimate_s=0.2,
    )


def _output(request_id: str, tokens: int, finished: bool = False) -> SimpleNamespace:
    return SimpleNamespace(request_id=request_id, new_token_ids=[1] * tokens, finished=finished)


class _Engine:
    """An engine of scripted steps: each appends its round (if any) and returns its outputs; ``lose`` makes a step
    raise ``KeyboardInterrupt`` after its round with its outputs lost (nothing left for ``take_undelivered``), as a
    signal that came as it returned did; ``signal`` makes it send itself SIGINT as the last thing before returning."""

    def __init__(self, steps: list[tuple[list[int] | None, list[SimpleNamespace]]]) -> None:
        self.round_stats: list[RoundStats] = []
        self.steps = steps
        self.lose = self.signal = -1
        self.calls = 0

    def step(self) -> list[SimpleNamespace]:
        emitted, outputs = self.steps[self.calls]
        self.calls += 1
        if emitted is not None:
            self.round_stats.append(_round(emitted))
        if self.calls - 1 == self.lose:
            raise KeyboardInterrupt("came as the step returned")
        if self.calls - 1 == self.signal:
            os.kill(os.getpid(), signal.SIGINT)
        return outputs

    def take_undelivered(self) -> list[SimpleNamespace]:
        return []


def _scripted() -> _Engine:
    """Prefill of a and b, then a round of both (a finishes), then a round of b alone."""
    return _Engine(
        [
            (None, [_output("a", 1), _output("b", 1)]),
            ([3, 2], [_output("a", 3, finished=True), _output("b", 2)]),
            ([4], [_output("b", 4)]),
        ]
    )


def test_a_round_whose_outputs_an_interrupt_lost_is_dropped():
    """The interrupted step's outputs never came, so none of its rows made a written result: before, the round
    (rows not told apart) was kept whole, with the row of the request not written."""
    engine = _scripted()
    engine.lose = 1
    ledger = RoundLedger(engine)
    ledger.step()
    assert ledger.step() == [] and ledger.interrupt is not None
    assert ledger.kept(set()) == []


def test_a_signal_as_the_step_returns_waits_for_its_outputs():
    """A SIGINT that came as the engine's step returned raised before the ledger had its outputs: now it is held to
    the ledger's end, the outputs come back with the interrupt kept for the caller, and the round's rows are known."""
    engine = _scripted()
    engine.signal = 1
    ledger = RoundLedger(engine)
    ledger.step()
    outputs = ledger.step()
    assert [o.request_id for o in outputs] == ["a", "b"] and ledger.interrupt is not None
    (kept,) = ledger.kept({"a"})
    assert kept.emitted_tokens == [3]


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"prompt_ids": [5 + i, 6, 7]}) + "\n" for i in range(6)))
    return path


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def _consistent(out: Path) -> None:
    """The stats hold the rows of exactly the results written (by their accept_lengths)."""
    stats = json.loads(out.with_suffix(".stats.json").read_text())
    records = [r for r in _records(out) if r["index"] in set(stats["results"])]
    assert sorted(stats["results"]) == sorted(r["index"] for r in _records(out))
    assert stats["emitted_tokens"] == sum(sum(r["accept_lengths"]) for r in records)
    assert sum(r["batch_size"] for r in stats["round_log"]) == sum(len(r["accept_lengths"]) for r in records)


@pytest.mark.parametrize("owner", [Engine, RoundLedger])
def test_a_signal_as_a_step_returns_keeps_its_results_and_their_stats(model_dir, prompts, tmp_path, monkeypatch, owner):
    """SIGINT as Engine.step (or the ledger's step) returned a step that finished requests: every result it
    returned is written, the stats hold exactly the written results' rows, and so do the resumed run's."""
    out = tmp_path / "out.jsonl"
    step, returned = owner.step, []

    def signalled(self):
        outputs = step(self)
        finished = [o.request_id for o in outputs if o.finished]
        returned.extend(finished)
        if finished and len(returned) > 4 and not signalled.sent:
            signalled.sent = True
            os.kill(os.getpid(), signal.SIGINT)
        return outputs

    signalled.sent = False
    monkeypatch.setattr(owner, "step", signalled)
    assert main(_args(model_dir, prompts, out)) == 130
    assert signalled.sent and len(_records(out)) == len(returned) < 24
    _consistent(out)
    monkeypatch.setattr(owner, "step", step)
    assert main(_args(model_dir, prompts, out)) == 0
    _consistent(out)


def _full_after(monkeypatch, count: int) -> None:
    """The output's write fails as on a file-size limit once ``count`` results are written."""
    write = ResultStream.write

    def limited(self, record):
        if len(self.done) == count:
            raise OSError(errno.EFBIG, "File too large")
        write(self, record)

    monkeypatch.setattr(ResultStream, "write", limited)


def test_a_disk_full_stop_writes_the_stats_of_the_results_kept(model_dir, prompts, tmp_path, monkeypatch, capsys):
    """Ctrl-C wrote the stats of the results kept; a full disk (or ``ulimit -f``) stopped the run with none."""
    out = tmp_path / "out.jsonl"
    _full_after(monkeypatch, 7)
    assert main(_args(model_dir, prompts, out)) == 2
    assert "file too large" in capsys.readouterr().err
    assert len(_records(out)) == 7
    _consistent(out)
    monkeypatch.undo()
    assert main(_args(model_dir, prompts, out)) == 0
    _consistent(out)


def test_stats_that_cannot_be_written_either_do_not_hide_the_stop(model_dir, prompts, tmp_path, monkeypatch, capsys):
    """The stats written after a full disk stopped the run may not fit either: the stop is still what is said,
    with one line saying that writing the stats failed too."""
    out = tmp_path / "out.jsonl"
    _full_after(monkeypatch, 7)

    def no_room(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(generate_module, "write_reports", no_room)
    assert main(_args(model_dir, prompts, out)) == 2
    err = capsys.readouterr().err.splitlines()
    assert any("file too large" in line and "7 of 24 results are kept" in line for line in err)
    assert len([line for line in err if "stats_output=" in line and "failed too" in line and "No space" in line]) == 1
    assert not out.with_suffix(".stats.json").exists()
