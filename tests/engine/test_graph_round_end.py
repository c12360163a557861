"""A graphed round takes its rows' slots, gathers their inputs from the slot state and ends inside its graph
(`SlotState.gather`, `close_round`: the finish rules, the slots advanced, the results packed): on the CPU through the
runner's graph path, requests that stop on their own stop ids, on EOS, at their length and at the context end as the
eager engine's do, in slots that earlier requests with other stop ids held; padding rows start every round afresh;
and a graphed step launches ~70 fewer eager ops than when all of that ran around the replay."""

from __future__ import annotations

import random
from functools import partial

import pytest

import fastrl.engine.engine as engine_module
from fastrl.adaptive.factory import build_selector
from fastrl.adaptive.fixed import FixedSelector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.bench.eager_ops import OpCounter, count_steps, graph_path_counted
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.engine.runner import ModelRunner
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.strategy.strategy import Strategy
from tests.engine.test_graph_capture_safety import guarded_capture

CONTEXT = 48


@pytest.fixture(scope="module")
def models():
    policy = load_model(bundled_model_dir())
    return policy, load_drafter(bundled_drafter_dir(), policy)[0]


def _requests(seed: int, stops: dict[int, list[int]]) -> list[GenerateInput]:
    """14 requests of mixed sampling, some ignoring EOS, some long enough to meet the context end; request i stops
    on ``stops.get(i, [])``."""
    rng = random.Random(seed)
    settings = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.8, top_p=0.9), dict(top_k=3)]
    return [
        GenerateInput(
            [1] + [rng.randrange(3, 90) for _ in range(rng.randint(2, 9))],
            SamplingParams(
                max_new_tokens=rng.choice([6, 12, 24, 60]),
                seed=seed * 100 + i,
                ignore_eos=rng.random() < 0.5,
                stop_token_ids=stops.get(i, []),
                **settings[i % 4],
            ),
        )
        for i in range(14)
    ]


def _generate(models, strategy: str, graphs: bool, inputs: list[GenerateInput], monkeypatch) -> list:
    policy, drafter = models
    config = EngineConfig(5, CONTEXT, "cpu", "float64", cuda_graphs=graphs, attention_kernel=False)
    with monkeypatch.context() as patch:
        if graphs:
            patch.setattr(engine_module, "ModelRunner", partial(ModelRunner, graph_capture=guarded_capture))
        engine = Engine(
            policy, config, drafter=None if strategy == "disable" else drafter, selector=build_selector(strategy)
        )
        assert (engine.runner.graphs is not None) == graphs
        return engine.generate(inputs)


@pytest.mark.parametrize(("strategy", "seed"), [("disable", 0), ("3_1_4", 1), ("2_2_4", 2), ("8_1_9@0.3", 3)])
def test_stops_lengths_and_context_end_graphed_rounds_as_eager_ones(models, strategy, seed, monkeypatch):
    # each request's stop id: a token its unstopped eager run emits a few tokens in (so that it stops there), or
    # one past the vocabulary (never met); 14 requests through 5 slots, so slots are reused by requests whose stop
    # ids differ from their last occupant's
    first = _generate(models, strategy, False, _requests(seed, {}), monkeypatch)
    rng = random.Random(seed)
    stops = {}
    for i, out in enumerate(first):
        if rng.random() < 0.6 and len(out.token_ids) > 3:
            stops[i] = [out.token_ids[rng.randint(1, len(out.token_ids) - 2)], 10**6]
    inputs = _requests(seed, stops)
    eager = _generate(models, strategy, False, inputs, monkeypatch)
    graphed = _generate(models, strategy, True, inputs, monkeypatch)
    for e, g in zip(eager, graphed, strict=True):
        assert (g.token_ids, g.finish_reason) == (e.token_ids, e.finish_reason), e.request_id
        assert max(abs(a - b) for a, b in zip(g.logprobs, e.logprobs, strict=True)) < 1e-9
    reasons = {o.finish_reason.value for o in eager}
    assert "stop" in reasons and "length" in reasons  # the rules the graphs now apply were met
    assert sum(o.finish_reason.value == "stop" for o in eager) > sum(o.finish_reason.value == "stop" for o in first)


@pytest.mark.parametrize(("strategy", "most"), [("disable", 26), ("5_1_6", 52)])
def test_a_graphed_step_launches_the_rounds_end_inside_its_graph(models, strategy, most):
    """Eager aten ops a graphed step dispatches around its replay (94 for a plain step and 112-117 for `5_1_6`
    when the round's end ran eagerly and the rows' inputs were gathered around it); none of them from the finish
    rules, the state's advance, the packing or the gathers of the rows' inputs."""
    policy, drafter = models
    counter = OpCounter(where=True)
    with graph_path_counted(counter):
        arm = Strategy.parse(strategy)
        config = EngineConfig(max_batch_size=4, max_model_len=256, attention_kernel=False)
        engine = Engine(policy, config, drafter=drafter if arm.uses_drafter else None, selector=FixedSelector(arm))
        for seed in range(4):  # a batch that fills its bucket: no padding rows to fill
            params = SamplingParams(max_new_tokens=60, temperature=1.0, seed=seed, ignore_eos=True)
            engine.add_request([1, 5 + seed, 7, 9, 11], params)
        count_steps(engine, counter, 4)
    assert 0 < sum(counter.ops.values()) / 4 <= most
    files = {line.split(":")[0] for line, _ in counter.lines}
    assert not files & {"engine/finish.py"}
    inside = (" advance", " close_round", " pack", " gather", " inputs", "sampler.py")
    assert not any(part in line for line, _ in counter.lines for part in inside)


def test_padding_rows_start_every_round_where_a_fresh_slot_does(models, monkeypatch):
    """Batches smaller than their bucket pad on the scratch slot, whose rows a graph gathers from the slot state
    like any other: its length and last token are back at 0 after every round, however many padded rounds ran (a
    length that grew with them would walk past the context's pages), and the tokens stay the eager engine's."""
    policy, _ = models

    def wave(w: int) -> list[GenerateInput]:  # three rows at a time on five slots: bucket 4, one padding row
        params = [
            SamplingParams(max_new_tokens=30, temperature=1.0, seed=10 * w + i, ignore_eos=True) for i in range(3)
        ]
        return [GenerateInput([1, 5 + w, 9 + i], p, f"w{w}-{i}") for i, p in enumerate(params)]

    eager = Engine(policy, EngineConfig(5, CONTEXT, "cpu", "float64", cuda_graphs=False))
    with monkeypatch.context() as patch:
        patch.setattr(engine_module, "ModelRunner", partial(ModelRunner, graph_capture=guarded_capture))
        engine = Engine(policy, EngineConfig(5, CONTEXT, "cpu", "float64", attention_kernel=False))
    state, scratch = engine.runner.state, engine.runner.state.scratch_slot
    assert scratch == 5
    for w in range(4):
        for i in wave(w):
            engine.add_request(i.prompt_ids, i.params, i.request_id)
        done = []
        while engine.has_unfinished():
            done += [o for o in engine.step() if o.finished]
            assert int(state.lengths[scratch]) == 0 and int(state.last[scratch]) == 0
        assert [o.token_ids for o in sorted(done, key=lambda o: o.request_id)] == [
            o.token_ids for o in eager.generate(wave(w))
        ]
    padded = [s for s in engine.round_stats if s.batch_size == 3]
    assert len(padded) > CONTEXT  # more padded rounds than the context has positions
