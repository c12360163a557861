"""Ctrl-C in the parts of the engine's calls that ran before their held block: a step that had taken what earlier
steps left (outputs parked, requests aborted while waiting) and was telling the history index of them; a generate
call queueing its batch; a drop aborting its requests. Each now waits for the block's end, so nothing taken is lost,
no id stays taken, and the call can be made again."""

from __future__ import annotations

import os
import signal

import pytest

from fastrl.adaptive.fixed import FixedSelector
from fastrl.assets_path import bundled_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.engine.request import FinishReason
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.history import HistoryConfig
from fastrl.speculative.history.index import HistoryIndex


@pytest.fixture(scope="module")
def policy():
    return load_model(bundled_model_dir()).eval()


def _interrupt_on_call(monkeypatch, owner: type, name: str, call: int) -> None:
    """A real SIGINT at the start of the ``call``-th (1-based) call of ``owner.name``."""
    original, calls = getattr(owner, name), [0]

    def interrupted(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, interrupted)


def test_an_interrupt_while_a_step_tells_the_history_of_aborted_requests_loses_none(policy, monkeypatch):
    """The step had moved the requests aborted while waiting out of the engine when Ctrl-C came: their outputs were
    never delivered and their ids stayed taken for good (every later generate refused)."""
    history = HistoryIndex(HistoryConfig())
    engine = Engine(policy, EngineConfig(max_batch_size=1, max_model_len=64), None, FixedSelector("suffix_8"), history)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    engine.add_request([1, 5, 6], params, "a")
    engine.add_request([1, 7, 8], params, "b")
    engine.step()  # a admitted; b waits
    assert engine.abort("b")
    with monkeypatch.context() as patch:
        _interrupt_on_call(patch, HistoryIndex, "finish", 1)
        with pytest.raises(KeyboardInterrupt, match="held to the end of the engine's step"):
            engine.step()
    parked = {out.request_id: out for out in engine.take_undelivered()}
    assert parked["b"].finished and parked["b"].finish_reason == FinishReason.ABORT
    assert not history.is_live("b")
    assert engine.add_request([1, 7, 8], params, "b") == "b"  # the id is free again
    delivered = []
    while engine.has_unfinished():
        delivered += [out.request_id for out in engine.step() if out.finished]
    assert sorted(delivered) == ["a", "b"]


def test_a_history_that_raises_while_told_of_aborted_requests_loses_none(policy, monkeypatch):
    """An error from the history index there (not an interrupt) lost the requests the step had taken too: the ones
    not yet told stay for the next step, which delivers them all."""
    history = HistoryIndex(HistoryConfig())
    engine = Engine(policy, EngineConfig(max_batch_size=1, max_model_len=64), None, FixedSelector("suffix_8"), history)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    for request_id, prompt in (("a", [1, 5, 6]), ("b", [1, 7, 8]), ("c", [1, 9, 8])):
        engine.add_request(prompt, params, request_id)
    engine.step()  # a admitted; b and c wait
    assert engine.abort("b") and engine.abort("c")
    original = HistoryIndex.finish

    def failing_once(self, *args, **kwargs):
        monkeypatch.setattr(HistoryIndex, "finish", original)
        raise RuntimeError("history fault")

    monkeypatch.setattr(HistoryIndex, "finish", failing_once)
    with pytest.raises(RuntimeError, match="history fault"):
        engine.step()
    delivered = []
    while engine.has_unfinished():
        delivered += [out.request_id for out in engine.step() if out.finished]
    assert sorted(delivered) == ["a", "b", "c"]
    assert not any(history.is_live(i) for i in "abc") and not engine._live_ids


def test_an_interrupt_while_generate_queues_its_batch_leaves_nothing_running(policy, monkeypatch):
    """The requests queued before Ctrl-C stayed in the engine: the same call again was refused ('already
    running')."""
    engine = Engine(policy, EngineConfig(max_batch_size=4, max_model_len=64), None, FixedSelector("disable"))
    batch = [GenerateInput([1, 5 + i, 6], SamplingParams(max_new_tokens=4, seed=i), f"r{i}") for i in range(6)]
    with monkeypatch.context() as patch:
        _interrupt_on_call(patch, Engine, "_queue", 3)
        with pytest.raises(KeyboardInterrupt, match="held to the end of queueing"):
            engine.generate(batch)
    assert not engine.has_unfinished() and not engine.scheduler.running
    again = engine.generate(batch)
    fresh = Engine(policy, EngineConfig(max_batch_size=4, max_model_len=64), None, FixedSelector("disable"))
    assert [o.token_ids for o in again] == [o.token_ids for o in fresh.generate(batch)]


def test_an_interrupt_while_drop_aborts_its_requests_still_drops_them_all(policy, monkeypatch):
    """Ctrl-C between two of drop's aborts stopped it there: the other requests ran on, their ids taken."""
    engine = Engine(policy, EngineConfig(max_batch_size=2, max_model_len=64), None, FixedSelector("disable"))
    params = SamplingParams(max_new_tokens=30, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request([1, 5 + i, 6], params, f"d{i}") for i in range(3)]
    engine.step()
    with monkeypatch.context() as patch:
        _interrupt_on_call(patch, Engine, "abort", 1)
        with pytest.raises(KeyboardInterrupt, match="held to the end of dropping requests"):
            engine.drop(ids)
    assert not engine.has_unfinished()
    assert all(engine.add_request([1, 9], params, i) == i for i in ids)  # every id free again
