"""What a library caller hands the engine is checked before anything is queued: a count past int64 (which broke
step() and left a neighbour finished with a pad token), prompts that are not one row of ids (a 2-D tensor, a
dict's keys, a set, a generator), and generate() while add_request's requests still run (their outputs were
dropped)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastrl.assets_path import bundled_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams


@pytest.fixture(scope="module")
def engine():
    return Engine(load_model(bundled_model_dir()).eval(), EngineConfig(max_batch_size=4, max_model_len=64))


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"max_new_tokens": 2**63}, "max_new_tokens must be an integer in \\[1, 2\\*\\*62\\)"),
        ({"max_new_tokens": 2**62}, "max_new_tokens must be an integer in \\[1, 2\\*\\*62\\)"),
        ({"top_k": 2**63}, "top_k must be an integer in \\[0, 2\\*\\*62\\)"),
    ],
)
def test_counts_past_int64_are_refused(values, said):
    with pytest.raises(ValueError, match=said):
        SamplingParams(**values)


def test_the_largest_counts_run_to_the_context(engine):
    params = SamplingParams(max_new_tokens=2**62 - 1, top_k=2**62 - 1, temperature=1.0, seed=1)
    good = SamplingParams(max_new_tokens=6, temperature=0.0)
    out = engine.generate([GenerateInput([1, 5, 6], params), GenerateInput([1, 7, 8], good)])
    assert out[0].finish_reason.value in ("context", "stop") and len(out[1].token_ids) in range(1, 7)


@pytest.mark.parametrize(
    ("prompt", "said"),
    [
        (torch.tensor([[1, 5, 6]]), "one row of integers, got 2 dimensions"),
        (torch.tensor(5), "one row of integers, got 0 dimensions"),
        (np.array([[1, 5]]), "one row of integers, got 2 dimensions"),
        ({1: "a", 5: "b"}, "a sequence of integers, got dict"),
        ({1, 5, 6}, "a sequence of integers, got set"),
        ((t for t in [1, 5, 6]), "a sequence of integers, got generator"),
    ],
)
def test_a_prompt_that_is_not_one_row_of_ids_is_refused(engine, prompt, said):
    with pytest.raises(ValueError, match=said):
        engine.add_request(prompt, SamplingParams(max_new_tokens=2))
    assert not engine.has_unfinished()


@pytest.mark.parametrize(
    "prompt",
    [torch.tensor([4.0, 5.0]), [torch.tensor(4.0), torch.tensor(5.0)], torch.tensor([True, False]),
     [torch.tensor(True)], [torch.tensor([4, 5])]],
)  # fmt: skip
def test_a_tensor_of_non_integers_is_refused(engine, prompt):
    """A float tensor was a bare TypeError, a bool tensor was taken as ids 1 and 0."""
    with pytest.raises(ValueError, match="prompt ids must be integers"):
        engine.add_request(prompt, SamplingParams(max_new_tokens=2))
    assert not engine.has_unfinished()
    ids = engine.generate([GenerateInput(torch.tensor([1, 5], dtype=torch.int32), SamplingParams(max_new_tokens=2))])
    assert ids[0].prompt_ids == [1, 5]


@pytest.mark.parametrize("strategy", ["disable", "suffix_8"])
def test_an_id_made_for_an_input_skips_the_ids_later_inputs_bring(strategy):
    """generate([no id, "req-0"]) gave both requests the id req-0: the first output was lost, and with a history
    strategy the history index refused the second after both were queued, leaving the engine stuck."""
    from fastrl.adaptive.fixed import FixedSelector

    policy = load_model(bundled_model_dir()).eval()
    engine = Engine(policy, EngineConfig(max_batch_size=4, max_model_len=64), selector=FixedSelector(strategy))
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    inputs = [GenerateInput([1, 5, 6], params), GenerateInput([1, 9, 9, 9], params, "req-0")]
    out = engine.generate(inputs)
    assert out[1].request_id == "req-0" and out[0].request_id != "req-0"
    assert [o.prompt_ids for o in out] == [[1, 5, 6], [1, 9, 9, 9]]
    alone = Engine(policy, EngineConfig(max_batch_size=1, max_model_len=64)).generate(inputs[:1])
    assert out[0].token_ids == alone[0].token_ids
    assert not engine.has_unfinished() and len(engine.generate([GenerateInput([1, 7], params, "z")])) == 1


def test_generate_refuses_while_streamed_requests_run(engine):
    engine.add_request([1, 5, 6], SamplingParams(max_new_tokens=3, temperature=0.0), "streamed")
    with pytest.raises(ValueError, match="requests queued with add_request are still running"):
        engine.generate([GenerateInput([1, 7], SamplingParams(max_new_tokens=2))])
    finished = []
    while engine.has_unfinished():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == ["streamed"]
    assert len(engine.generate([GenerateInput([1, 7], SamplingParams(max_new_tokens=2))])) == 1


def test_a_generate_cut_short_leaves_the_engine_usable():
    """An interrupted generate aborts its own requests and drops their outputs (their caller is gone): they were
    left queued, and the next generate ran them to their end inside its own rounds (148 rounds for a 2-token call)."""
    engine = Engine(load_model(bundled_model_dir()).eval(), EngineConfig(max_batch_size=4, max_model_len=64))
    real, calls = engine.step, []

    def cut() -> list:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real()

    engine.step = cut
    with pytest.raises(KeyboardInterrupt):
        engine.generate([GenerateInput([1, 5, 6], SamplingParams(max_new_tokens=20, temperature=0.0))])
    engine.step = real
    assert not engine.has_unfinished()
    rounds = len(engine.round_stats)
    out = engine.generate([GenerateInput([1, 7], SamplingParams(max_new_tokens=2, temperature=0.0), "after")])
    assert [o.request_id for o in out] == ["after"] and not engine.has_unfinished()
    assert len(engine.round_stats) - rounds == 1  # its own one decode round, nothing of the interrupted call


def test_a_selector_choosing_outside_its_strategies_is_named():
    """The engine prepares the rounds of the selector's strategies only; a choice outside them was a KeyError or
    an AttributeError deep in the runner."""
    from fastrl.adaptive.fixed import FixedSelector
    from fastrl.strategy.strategy import Strategy

    class Stray(FixedSelector):
        def choose(self, batch_size: int) -> Strategy:
            return Strategy.parse("5_1_6")

    policy = load_model(bundled_model_dir()).eval()
    engine = Engine(policy, EngineConfig(max_batch_size=2, max_model_len=64), selector=Stray("disable"))
    with pytest.raises(ValueError, match=r"Stray chose 5_1_6, outside its strategies \['disable'\]"):
        engine.generate([GenerateInput([1, 5, 6], SamplingParams(max_new_tokens=4))])


def test_engines_sharing_a_history_index_never_share_a_request_id():
    """Two engines over one index (the index carries earlier responses across engines): an id live in the index
    through the other engine is skipped by the ids made here and refused, by name, when a caller brings it."""
    from fastrl.adaptive.fixed import FixedSelector
    from fastrl.speculative.history import HistoryIndex

    policy = load_model(bundled_model_dir()).eval()
    index = HistoryIndex()
    config = EngineConfig(max_batch_size=4, max_model_len=64)
    first = Engine(policy, config, selector=FixedSelector("suffix_8"), history=index)
    second = Engine(policy, config, selector=FixedSelector("suffix_8"), history=index)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    running = [first.add_request([1, 5, 6], params), first.add_request([1, 5, 7], params)]
    with pytest.raises(ValueError, match=f"request id '{running[1]}' is running in another engine that shares"):
        second.generate([GenerateInput([1, 9, 9], params), GenerateInput([1, 9, 8], params, running[1])])
    outputs = second.generate([GenerateInput([1, 5, 6], params), GenerateInput([1, 9, 8], params)])
    assert not {o.request_id for o in outputs} & set(running)  # ids made here skip those live in the index
    assert second.round_stats and not second.has_unfinished()  # the refused call left nothing queued
    while first.has_unfinished():
        first.step()
