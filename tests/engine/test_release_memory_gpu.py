"""On a CUDA device: an idle engine's release gives the device its KV pools, its weights and its graphs' pool back
(the caching allocator returns them to the driver), and after the restore the graphs, captured again at the new
addresses, decode as plain decoding does."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.adaptive.factory import build_selector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter

pytestmark = pytest.mark.gpu


def _inputs(count: int, seed: int) -> list[GenerateInput]:
    rng = random.Random(seed)
    return [
        GenerateInput(
            [1] + [rng.randrange(3, 90) for _ in range(rng.randint(4, 30))],
            SamplingParams(max_new_tokens=rng.randint(8, 80), seed=seed * 100 + i, temperature=rng.choice([0.0, 1.0])),
            f"r{seed}-{i}",
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("strategy", ["disable", "5_1_6", "8_1_9@0.3", "bandit", "5_1_6 over a draft vocabulary"])
def test_release_gives_the_memory_back_and_restored_graphs_decode_as_plain(strategy):
    policy = load_model(bundled_model_dir())
    drafter = load_drafter(bundled_drafter_dir(), policy)[0] if strategy != "disable" else None
    if strategy.endswith("over a draft vocabulary"):  # its restricted head is a cache beside the weights
        strategy = strategy.split()[0]
        drafter.set_draft_vocab(torch.arange(0, policy.config.vocab_size, 2))
    config = EngineConfig(max_batch_size=8, device="cuda", dtype="float64", cuda_graphs=True)
    engine = Engine(policy, config, drafter=drafter, selector=build_selector(strategy))
    plain = Engine(load_model(bundled_model_dir()), EngineConfig(16, device="cuda", dtype="float64", cuda_graphs=False))
    for wave in range(2):
        inputs = _inputs(10, wave)
        expected = plain.generate(inputs)
        for out, ref in zip(engine.generate(inputs), expected, strict=True):
            assert out.token_ids == ref.token_ids and out.finish_reason == ref.finish_reason
            assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-9)
        torch.cuda.synchronize()
        reserved = torch.cuda.memory_reserved()
        kv = engine.release_memory(["kv_cache"])
        assert kv > 0 and engine.runner.graphs is None
        assert torch.cuda.memory_reserved() <= reserved - kv  # the pools' own segments, back to the driver
        allocated = torch.cuda.memory_allocated()
        weights = engine.release_memory()  # the rest: the weights
        assert all(p.device.type == "cpu" for p in engine.model.parameters())
        if drafter is not None and drafter.draft_vocab is not None:  # no copy of the head left on the device
            assert drafter.cached_head() is None and drafter.draft_vocab.device.type == "cpu"
        assert weights > 0 and torch.cuda.memory_allocated() <= allocated - weights
        engine.restore_memory(["weights"])
        assert all(p.device.type == "cuda" for p in engine.model.parameters()) and engine.runner.graphs is None
        engine.restore_memory()
        assert engine.runner.graphs is not None
