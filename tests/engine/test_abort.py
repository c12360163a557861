"""Engine.abort: an aborted request ends at the next step with FinishReason.ABORT and the tokens (and log-probs) it
had, a prefix of what plain decoding gives it; every other request still decodes exactly as plain decoding does;
slots and pages all come back; ids that are unknown or finished are refused without a change. Random cases (model,
strategy, sampling, arrivals, memory pressure) with aborts at random steps, of requests waiting, running or
preempted."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine
from fastrl.engine.request import FinishReason, RequestOutput
from fastrl.speculative.history.config import HistoryConfig
from fastrl.speculative.history.index import HistoryIndex
from fastrl.strategy.strategy import DISABLE, Strategy
from tests.speculative.exactness_cases import LOGPROB_TOLS, decode, fused_drafter, make_case, models, pressure


def _run_with_aborts(case, keys: dict, seed: int) -> tuple[dict[str, RequestOutput], dict[str, bool], Engine]:
    """The case's speculative run in an engine of ``keys``, aborting random requests at random steps; returns the
    outputs by id, what each abort call answered, and the engine."""
    rng = random.Random(seed)
    policy, drafter = models(case.model, case.dtype)
    if case.fused:
        drafter = fused_drafter(case.model, case.fused, case.dtype)
    selector = case.selector()
    speculative = any(s.uses_drafter for s in selector.strategies)
    drafter.set_draft_vocab(None if case.draft_vocab is None else torch.tensor(case.draft_vocab))
    engine = Engine(
        policy,
        EngineConfig(max_batch_size=case.batch_size, dtype=case.dtype, **keys),
        drafter=drafter if speculative else None,
        selector=selector,
    )
    order = sorted(range(len(case.inputs)), key=lambda i: case.arrivals[i])
    victims = {i.request_id: rng.randint(0, 14) for i in case.inputs if rng.random() < 0.4}
    answered: dict[str, bool] = {}
    done: dict[str, RequestOutput] = {}
    step = 0
    while order or engine.has_unfinished():
        while order and case.arrivals[order[0]] <= step:
            inp = case.inputs[order.pop(0)]
            engine.add_request(inp.prompt_ids, inp.params, inp.request_id)
        for rid, at in victims.items():
            if at == step and rid not in answered:
                answered[rid] = engine.abort(rid)
        for out in engine.step():
            if out.finished:
                assert out.request_id not in done, f"{out.request_id} finished twice"
                done[out.request_id] = out
        step += 1
    return done, answered, engine


@pytest.mark.parametrize("seed", range(24))
def test_aborted_requests_end_with_a_prefix_of_plain_and_the_others_stay_exact(seed):
    case = make_case(1000 + seed, max_new_tokens=40)
    plain = decode(case, FixedSelector(DISABLE), case.plain_batch_size, [0] * len(case.inputs))
    keys = pressure(case) if seed % 2 else {}
    done, answered, engine = _run_with_aborts(case, keys, seed)
    tol = LOGPROB_TOLS[case.dtype]
    for ref in plain:
        out = done[ref.request_id]
        if answered.get(ref.request_id):
            assert out.finish_reason == FinishReason.ABORT, case.describe()
            n = len(out.token_ids)
            assert n < len(ref.token_ids)  # a request that has all its tokens has finished: refused
            assert out.token_ids == ref.token_ids[:n], case.describe()
            assert out.logprobs == pytest.approx(ref.logprobs[:n], rel=0, abs=tol)
            assert n == (1 + sum(out.accept_lengths) if n else 0)  # the prefill's token, then each round's
        else:
            if ref.request_id in answered:  # refused: it had finished by then, and ends as plain decoding ends it
                assert out.finish_reason != FinishReason.ABORT
            assert out.token_ids == ref.token_ids, case.describe()
            assert out.logprobs == pytest.approx(ref.logprobs, rel=0, abs=tol)
            assert out.finish_reason == ref.finish_reason
    pool = engine.scheduler.pool
    assert pool.free_pages == pool.num_pages, "an aborted request kept pages"
    assert not engine.scheduler.running and not engine.scheduler.waiting


def test_abort_of_unknown_and_finished_ids_changes_nothing():
    case = make_case(7, max_new_tokens=12)
    policy, _ = models(case.model, case.dtype)
    engine = Engine(policy, EngineConfig(max_batch_size=4, dtype=case.dtype))
    first = case.inputs[0]
    rid = engine.add_request(first.prompt_ids, first.params, "a")
    assert engine.abort("nobody") is False
    outs = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in outs] == [rid]
    assert outs[0].finish_reason != FinishReason.ABORT
    assert engine.abort(rid) is False  # delivered: the id is free again
    again = engine.add_request(first.prompt_ids, first.params, rid)  # and may be reused
    assert engine.abort(again) is True
    assert engine.abort(again) is False  # aborted already: its output comes with the next step
    (out,) = engine.step()
    assert out.finish_reason == FinishReason.ABORT and out.token_ids == [] and out.logprobs == []
    assert not engine.has_unfinished()


def test_abort_frees_the_slot_for_a_waiting_request_in_the_same_step():
    case = make_case(3, max_new_tokens=30)
    policy, _ = models(case.model, case.dtype)
    engine = Engine(policy, EngineConfig(max_batch_size=1, dtype=case.dtype))
    prompt, params = case.inputs[0].prompt_ids, case.inputs[0].params
    engine.add_request(prompt, params, "long")
    engine.step()  # "long" is prefilled and holds the only slot
    engine.add_request(prompt, params, "next")
    assert engine.abort("long")
    outs = engine.step()
    assert [o.request_id for o in outs if o.finished] == ["long"]
    assert [r.request_id for r in engine.scheduler.running] == ["next"]  # admitted in the step that freed the slot


def test_reusing_an_aborted_id_before_the_next_step_says_to_step_first():
    case = make_case(5, max_new_tokens=12)
    policy, _ = models(case.model, case.dtype)
    engine = Engine(policy, EngineConfig(max_batch_size=2, dtype=case.dtype))
    first = case.inputs[0]
    engine.add_request(first.prompt_ids, first.params, "x")
    assert engine.abort("x")
    with pytest.raises(ValueError, match=r"'x' has finished in this engine, but its output comes with the next step"):
        engine.add_request(first.prompt_ids, first.params, "x")
    (out,) = engine.step()
    assert out.finish_reason == FinishReason.ABORT
    engine.add_request(first.prompt_ids, first.params, "x")  # delivered: free again


@pytest.mark.parametrize("running", [False, True])
def test_an_aborted_id_stays_live_in_a_shared_history_until_it_is_delivered(running):
    """Waiting requests left the shared index at the abort, running ones at the next step: another engine on the
    index could take the id in between for one and not the other."""
    case = make_case(5, max_new_tokens=12)
    policy, drafter = models(case.model, case.dtype)
    history = HistoryIndex(HistoryConfig())
    selector = FixedSelector(Strategy.parse("suffix_4"))
    one, other = (
        Engine(policy, EngineConfig(max_batch_size=2, dtype=case.dtype), drafter, selector, history) for _ in "ab"
    )
    first = case.inputs[0]
    one.add_request(first.prompt_ids, first.params, "x")
    if running:
        one.step()
    assert one.abort("x")
    with pytest.raises(ValueError, match="running in another engine"):
        other.add_request(first.prompt_ids, first.params, "x")
    assert [o.finish_reason for o in one.step()] == [FinishReason.ABORT]
    other.add_request(first.prompt_ids, first.params, "x")


def test_a_request_aborted_before_its_first_token_leaves_no_response_in_the_history():
    """Aborted requests teach the history index what they emitted; one aborted while it waited emitted nothing, and
    its empty response was kept all the same: each took its prompt tail's share of history_tokens (evicting real
    responses) and went into checkpoints. One that emitted tokens is still kept."""
    from fastrl.assets_path import bundled_model_dir
    from fastrl.models.checkpoint import load_model
    from fastrl.sampling.params import SamplingParams

    model = load_model(bundled_model_dir())
    config = EngineConfig(max_batch_size=1, max_model_len=64, history_tokens=4096)
    engine = Engine(model, config, selector=FixedSelector("suffix_4"))
    first, queued = list(range(10, 30)), list(range(40, 60))
    params = SamplingParams(max_new_tokens=30, ignore_eos=True, seed=1)
    engine.add_request(first, params, "running")
    engine.step()  # it takes the only slot and emits its first token
    for i in range(4):
        engine.add_request(queued, params, f"waiting{i}")
    assert all(engine.abort(f"waiting{i}") for i in range(4)) and engine.abort("running")
    while engine.has_unfinished():
        engine.step()
    kept = {tuple(prompt): [len(r) for r in responses] for prompt, responses in engine.history.state().groups}
    assert kept.get(tuple(queued), []) == []
    assert len(kept[tuple(first)]) == 1 and kept[tuple(first)][0] >= 1
