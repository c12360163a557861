"""Admission in batches (`engine.admit_batch`): while requests decode and the queue outnumbers the free slots, the
scheduler waits for that many free slots, so arrivals prefill together; a queue that fits, or an idle engine, is
admitted at once; and no token depends on it."""

from __future__ import annotations

import random

import pytest

from fastrl.adaptive.factory import build_selector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.engine.page_pool import PagePool
from fastrl.engine.request import FinishReason, Request
from fastrl.engine.scheduler import Scheduler
from fastrl.rl.tasks.task import ArithChainTask
from fastrl.sampling.params import SamplingParams
from fastrl.strategy.strategy import DISABLE
from tests.speculative.exactness_cases import Case, _bundled_tokenizer, decode


def _request(i: int) -> Request:
    return Request(f"r{i}", [3, 4, 5], SamplingParams(max_new_tokens=4), seed=i)


def _scheduler(slots: int, admit_batch: int) -> Scheduler:
    return Scheduler(slots, 64, 100, PagePool(64, 16), admit_batch=admit_batch)


def test_a_backlog_waits_for_free_slots_and_a_queue_that_fits_does_not():
    s = _scheduler(8, 3)
    for i in range(20):
        s.add(_request(i))
    assert len(s.admit()) == 8  # nothing runs: the slots fill at once
    for r in s.running[:2]:
        r.finish_reason = FinishReason.LENGTH
    s.release_finished()
    assert s.admit() == []  # 2 free, 12 waiting, 6 running: wait for a third
    s.running[0].finish_reason = FinishReason.LENGTH
    s.release_finished()
    assert [r.request_id for r in s.admit()] == ["r8", "r9", "r10"]
    while len(s.waiting) > 1:  # drain the queue down to one request
        s.waiting.pop()
    s.running[0].finish_reason = FinishReason.LENGTH
    s.release_finished()
    assert [r.request_id for r in s.admit()] == ["r11"]  # one free slot holds the whole queue: no wait


@pytest.mark.parametrize("admit_batch", [1, 2, 5, 8])
def test_every_request_is_admitted_and_none_waits_with_nothing_running(admit_batch):
    """Random finishes: the scheduler never stalls (a step with nothing running always admits) and keeps FIFO."""
    rng = random.Random(admit_batch)
    s = _scheduler(8, admit_batch)
    for i in range(60):
        s.add(_request(i))
    order = []
    for _ in range(10_000):
        if not s.waiting and not s.running:
            break
        order += [r.request_id for r in s.admit()]
        assert s.running, "a step with requests waiting and nothing running admitted nobody"
        for r in s.running:
            if rng.random() < 0.3:
                r.finish_reason = FinishReason.LENGTH
        s.release_finished()
    assert order == [f"r{i}" for i in range(60)]


def _case(count: int) -> Case:
    rng = random.Random(7)
    tokenizer = _bundled_tokenizer()
    inputs = []
    for i in range(count):
        prompt = tokenizer(ArithChainTask().sample_problem(rng).prompt)["input_ids"]
        params = SamplingParams(max_new_tokens=rng.randint(8, 40), temperature=rng.choice([0.0, 1.0]), seed=90 + i)
        inputs.append(GenerateInput(prompt, params, request_id=f"q{i}"))
    return Case(7, "bundled", DISABLE, count, count, inputs, [0] * count)


def test_batched_admission_prefills_less_often_and_changes_no_token(monkeypatch):
    """A queue three times the slots, plain and speculative, admit_batch from 1 to the batch: the same tokens and
    log-probs as admitting at once, in fewer prefill forwards."""
    calls: list[int] = []
    prefill = Engine._prefill

    def counted(self, requests, progressed):
        calls.append(len(requests))
        return prefill(self, requests, progressed)

    monkeypatch.setattr(Engine, "_prefill", counted)
    case = _case(18)
    reference = decode(case, build_selector("disable"), 6, [0] * 18, {"admit_batch": 1})
    eager_calls = len(calls)
    rng = random.Random(3)
    for strategy in ("disable", "5_1_6", "2_2_4"):
        admit_batch = rng.randint(2, 6)
        calls.clear()
        arrivals = [rng.choice([0, 0, 0, 2, 5]) for _ in range(18)]
        outputs = decode(case, build_selector(strategy), 6, arrivals, {"admit_batch": admit_batch})
        for ref, out in zip(reference, outputs, strict=True):
            assert out.token_ids == ref.token_ids, (strategy, admit_batch, out.request_id)
            assert out.logprobs == pytest.approx(ref.logprobs, rel=0, abs=1e-9)
        if strategy == "disable":
            assert len(calls) < eager_calls, (admit_batch, calls)
        assert sum(calls) == 18


def test_the_default_is_an_eighth_of_the_slots_and_bad_values_are_named():
    assert EngineConfig(max_batch_size=256).admission_slots == 32
    assert EngineConfig(max_batch_size=7).admission_slots == 1
    assert EngineConfig(max_batch_size=16, admit_batch=16).admission_slots == 16
    # a copy with fewer slots keeps the key (calibration's engines): every slot, not more than there are
    assert EngineConfig(max_batch_size=16, admit_batch=40).admission_slots == 16
    for bad in (0, -1):
        with pytest.raises(ValueError, match=r"engine\.admit_batch must be >= 1 or None"):
            EngineConfig(max_batch_size=16, admit_batch=bad)
    with pytest.raises(ValueError, match=r"engine\.admit_batch must be an integer or None, got '4'"):
        EngineConfig(max_batch_size=16, admit_batch="4")
