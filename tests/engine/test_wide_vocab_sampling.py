"""On a vocabulary wide enough for the lazy Gumbel-argmax, plain decoding (which samples with it) gives the tokens
of speculative decoding (whose verifier samples with the round's full noise), sampled, filtered and greedy."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.sampling.gumbel_argmax import LAZY_MIN_VOCAB
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.strategy import Strategy
from tests.helpers import make_hf_model

VOCAB = LAZY_MIN_VOCAB + 904


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    path = tmp_path_factory.mktemp("wide")
    make_hf_model("llama", seed=3, vocab_size=VOCAB).save_pretrained(path)
    policy = load_model(path).to(torch.float64).eval()
    torch.manual_seed(1)
    return policy, EagleDrafter(policy.config).to(torch.float64).eval()


def _inputs() -> list[GenerateInput]:
    rng = random.Random(4)
    settings = [
        SamplingParams(max_new_tokens=24, temperature=1.0, seed=11, ignore_eos=True),
        SamplingParams(max_new_tokens=24, temperature=0.7, top_k=40, seed=12, ignore_eos=True),
        SamplingParams(max_new_tokens=24, temperature=1.3, top_p=0.8, seed=13, ignore_eos=True),
        SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True),
        SamplingParams(max_new_tokens=24, temperature=1.0, seed=14),
    ]
    return [
        GenerateInput([rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 12))], params, request_id=f"r{i}")
        for i, params in enumerate(settings * 2)
    ]


@pytest.mark.parametrize("strategy", ["3_1_4", "2_2_4"])
def test_plain_with_the_lazy_argmax_equals_speculative_with_full_noise(models, strategy):
    policy, drafter = models
    config = EngineConfig(max_batch_size=10, dtype="float64")
    plain = Engine(policy, config, selector=FixedSelector(Strategy.parse("disable"))).generate(_inputs())
    spec = Engine(policy, config, drafter=drafter, selector=FixedSelector(Strategy.parse(strategy))).generate(_inputs())
    for a, b in zip(plain, spec, strict=True):
        assert a.token_ids == b.token_ids, a.request_id
        assert a.finish_reason == b.finish_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-9
    assert len({t for out in plain for t in out.token_ids}) > 50  # sampled widely over the vocabulary
