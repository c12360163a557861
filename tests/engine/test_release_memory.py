"""An idle engine gives its KV pools (and, on an accelerator, its weights) back between rollouts and takes them
again: nothing it generates afterwards differs from plain decoding, whatever was released, on the eager and the
graph path; it refuses to release while a request is unfinished and to step while its memory is released."""

from __future__ import annotations

import random
from functools import partial

import pytest
import torch

import fastrl.engine.engine as engine_module
from fastrl.adaptive.factory import build_selector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.engine.request import FinishReason
from fastrl.engine.runner import ModelRunner
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter
from tests.engine.test_graph_capture_safety import guarded_capture

CONTEXT = 64
STRATEGIES = ["bandit", "3_1_4", "2_2_4", "8_1_9@0.3", "suffix_4", "3_1_4+suffix_4", "disable"]
PARTS = [("kv_cache",), ("weights",), ("kv_cache", "weights")]


@pytest.fixture(scope="module")
def models():
    policy = load_model(bundled_model_dir())
    return policy, load_drafter(bundled_drafter_dir(), policy)[0]


def _inputs(rng: random.Random, count: int, tag: str) -> list[GenerateInput]:
    settings = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.7, top_p=0.9), dict(top_k=4)]
    return [
        GenerateInput(
            [1] + [rng.randrange(3, 90) for _ in range(rng.randint(2, 12))],
            SamplingParams(
                max_new_tokens=rng.randint(1, 40),
                seed=rng.randrange(2**40),
                ignore_eos=rng.random() < 0.5,
                **rng.choice(settings),
            ),  # fmt: skip
            f"{tag}{i}",
        )
        for i in range(count)
    ]


def _engine(models, strategy: str, slots: int, graphs: bool, monkeypatch) -> Engine:
    policy, drafter = models
    config = EngineConfig(slots, CONTEXT, "cpu", "float64", cuda_graphs=graphs, attention_kernel=not graphs)
    with monkeypatch.context() as patch:
        if graphs:
            patch.setattr(engine_module, "ModelRunner", partial(ModelRunner, graph_capture=guarded_capture))
        return Engine(policy, config, drafter=drafter, selector=build_selector(strategy))


def _same(outputs, expected) -> None:
    for out, ref in zip(outputs, expected, strict=True):
        assert out.token_ids == ref.token_ids, out.request_id
        assert out.finish_reason == ref.finish_reason
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_after_a_release_and_restore_every_strategy_decodes_as_plain(models, seed, monkeypatch):
    rng = random.Random(seed)
    strategy, parts = rng.choice(STRATEGIES), rng.choice(PARTS)
    graphs = seed % 2 == 1  # the graph path on odd seeds: the graphs go with the memory and are captured again
    slots = rng.randint(1, 6)
    engine = _engine(models, strategy, slots, graphs, monkeypatch)
    plain = Engine(models[0], EngineConfig(16, CONTEXT, "cpu", "float64"))
    for wave in range(3):
        inputs = _inputs(rng, rng.randint(1, 9), f"w{wave}-")
        _same(engine.generate(inputs), plain.generate(inputs))
        before = engine.runner.graphs
        freed = engine.release_memory(parts)
        assert engine.memory_released == frozenset(parts)
        if "kv_cache" in parts:
            assert freed > 0 and all(c.released and c.k.numel() == 0 for c in engine.runner.caches)
        else:
            assert not any(c.released for c in engine.runner.caches)
        assert engine.runner.graphs is None
        engine.restore_memory(rng.choice([parts, ("kv_cache", "weights")]))  # restoring more than was released
        assert engine.memory_released == frozenset()
        assert not any(c.released for c in engine.runner.caches)
        assert (engine.runner.graphs is not None) == graphs and (before is None or engine.runner.graphs is not before)


def test_a_release_waits_for_no_request_and_a_released_engine_steps_nothing(models, monkeypatch):
    engine = _engine(models, "3_1_4", 2, False, monkeypatch)
    plain = Engine(models[0], EngineConfig(4, CONTEXT, "cpu", "float64"))
    rng = random.Random(7)
    first, later = _inputs(rng, 3, "a"), _inputs(rng, 2, "b")
    for i in first:
        engine.add_request(i.prompt_ids, i.params, i.request_id)
    engine.step()
    with pytest.raises(ValueError, match=r"Engine.release_memory: 3 requests are unfinished and 0 final outputs"):
        engine.release_memory()
    assert engine.memory_released == frozenset() and not any(c.released for c in engine.runner.caches)
    done = {}
    while engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    _same([done[i.request_id] for i in first], plain.generate(first))
    engine.release_memory(["kv_cache"])
    assert engine.step() == []  # nothing to do: a released engine may be stepped idle
    for i in later:  # queued while released: they wait for the memory
        engine.add_request(i.prompt_ids, i.params, i.request_id)
    with pytest.raises(RuntimeError, match=r"Engine.step: the engine.s kv_cache memory is released; call restore"):
        engine.step()
    engine.restore_memory()
    while engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    _same([done[i.request_id] for i in later], plain.generate(later))


def test_while_released_what_needs_no_memory_is_delivered_and_generate_queues_nothing(models, monkeypatch):
    """A request aborted while it waits for the memory, or refused at add, needs none: a released engine's step
    delivers it (a worker's stepping loop would otherwise wait for a restore that may only come after the release
    it blocks), and may release again; generate() refuses before queuing anything."""
    engine = _engine(models, "3_1_4", 2, False, monkeypatch)
    params = SamplingParams(max_new_tokens=4)
    engine.release_memory()
    engine.add_request([1, 5, 6], params, "waits")
    engine.add_request([1] * CONTEXT, params, "refused")  # past the context: refused at add, output pending
    assert engine.can_step()
    with pytest.raises(ValueError, match=r"1 requests are unfinished and 1 final outputs undelivered"):
        engine.release_memory()
    assert [(o.request_id, o.finish_reason) for o in engine.step()] == [("refused", FinishReason.ERROR)]
    assert not engine.can_step() and engine.has_unfinished()  # "waits" needs the memory
    with pytest.raises(RuntimeError, match=r"Engine.step: the engine.s kv_cache and weights memory is released"):
        engine.step()
    assert engine.abort("waits") and engine.can_step()
    (aborted,) = engine.step()
    assert (aborted.request_id, aborted.finish_reason, aborted.token_ids) == ("waits", FinishReason.ABORT, [])
    assert not engine.has_unfinished() and engine.release_memory() == 0  # released already: nothing more
    seeded = SamplingParams(max_new_tokens=4, seed=3)
    inputs = [GenerateInput([1, 7, 8], seeded, "g0"), GenerateInput([1, 9], seeded, "g1")]
    with pytest.raises(RuntimeError, match=r"Engine.generate: the engine.s kv_cache and weights memory is released"):
        engine.generate(inputs)
    assert not engine.has_unfinished() and list(engine.scheduler.waiting) == []
    engine.restore_memory()
    plain = Engine(models[0], EngineConfig(2, CONTEXT, "cpu", "float64"))
    _same(engine.generate(inputs), plain.generate(inputs))


@pytest.mark.parametrize("parts", [None, 5, b"kv_cache", [["kv_cache"]], [None]])
def test_parts_that_are_not_names_are_one_value_error(models, monkeypatch, parts):
    engine = _engine(models, "disable", 1, False, monkeypatch)
    with pytest.raises(ValueError, match=r"Engine.release_memory: (parts must be a part's name|.* is not a part)"):
        engine.release_memory(parts)
    assert engine.memory_released == frozenset()


def test_parts_are_checked_and_a_repeated_release_frees_nothing_more(models, monkeypatch):
    engine = _engine(models, "3_1_4", 2, False, monkeypatch)
    with pytest.raises(ValueError, match=r"Engine.release_memory: 'kv' is not a part of the engine's memory"):
        engine.release_memory(["kv"])
    with pytest.raises(ValueError, match=r"Engine.restore_memory: 'k' is not a part"):
        engine.restore_memory(["k"])
    assert engine.memory_released == frozenset()
    cache = engine.runner.cache
    expected = sum(2 * c.k.numel() * c.k.element_size() for c in engine.runner.caches)
    assert engine.release_memory("kv_cache") == expected  # a bare name is one part
    assert engine.release_memory("kv_cache") == 0
    assert cache.k.numel() == 0 and cache.k.dtype == torch.float64
    engine.restore_memory("kv_cache")
    assert cache.k.shape[0] == engine.model.config.num_hidden_layers and not bool(cache.k.any())
