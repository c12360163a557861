"""Speculative decoding is exact: every strategy, batch size and sampling setting reproduces plain decoding token
for token (and log-prob for log-prob), with a fresh drafter (worst-case acceptance) and a trained one."""

from __future__ import annotations

import pytest
import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from tests.engine.test_engine import _hf_greedy, assert_matches_hf
from tests.helpers import make_hf_model

STRATEGIES = ["1_1_2", "3_1_4", "5_4_8", "6_2_12", "8_4_32", "8_4_48"]
SETTINGS = [
    dict(temperature=0.0),
    dict(temperature=1.0),
    dict(temperature=0.7, top_p=0.9),
    dict(temperature=1.0, top_k=20),
]


def _inputs(vocab: int, count: int, new_tokens: int, seed: int = 0) -> list[GenerateInput]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        prompt = torch.randint(3, vocab, (int(torch.randint(2, 10, (1,), generator=g)),), generator=g).tolist()
        params = SamplingParams(max_new_tokens=new_tokens - (i % 5), seed=77 + i, ignore_eos=True, **SETTINGS[i % 4])
        out.append(GenerateInput(prompt, params, request_id=f"r{i}"))
    return out


@pytest.fixture(scope="module")
def random_setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    hf = make_hf_model("llama", seed=3)
    hf.save_pretrained(path)
    model = load_model(path)
    torch.manual_seed(0)
    drafter = EagleDrafter(model.config)
    inputs = _inputs(model.config.vocab_size, 16, 24)
    plain = Engine(model, EngineConfig(max_batch_size=16)).generate(inputs)
    return hf, model, drafter, inputs, plain


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_fresh_drafter_matches_plain(random_setup, strategy, batch_size):
    _, model, drafter, inputs, plain = random_setup
    subset = inputs if batch_size > 1 else inputs[:4]
    engine = Engine(model, EngineConfig(max_batch_size=batch_size), drafter=drafter, selector=FixedSelector(strategy))
    outs = engine.generate(subset)
    for ref, out in zip(plain, outs, strict=False):
        assert out.token_ids == ref.token_ids, f"{strategy} bs={batch_size} request {out.request_id}"
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-5)
        assert out.finish_reason == ref.finish_reason
    assert all(s.strategy.steps > 0 for s in engine.round_stats)


def test_speculative_greedy_matches_transformers(random_setup):
    hf, model, drafter, inputs, _ = random_setup
    greedy = [i for i in inputs if i.params.temperature == 0.0]
    engine = Engine(model, EngineConfig(max_batch_size=4), drafter=drafter, selector=FixedSelector("5_4_8"))
    for inp, out in zip(greedy, engine.generate(greedy), strict=True):
        theirs, gaps = _hf_greedy(hf, inp.prompt_ids, inp.params.max_new_tokens)
        assert_matches_hf(out.token_ids, theirs, gaps)


def test_hidden_states_match_plain(random_setup):
    _, model, drafter, inputs, _ = random_setup
    want = [GenerateInput(i.prompt_ids, i.params, i.request_id, return_hidden_states=True) for i in inputs[:4]]
    plain = Engine(model, EngineConfig(max_batch_size=4)).generate(want)
    spec = Engine(model, EngineConfig(max_batch_size=4), drafter=drafter, selector=FixedSelector("3_2_6")).generate(
        want
    )
    for a, b in zip(plain, spec, strict=True):
        assert a.hidden_states.shape == b.hidden_states.shape == (len(a.token_ids), model.config.hidden_size)
        torch.testing.assert_close(a.hidden_states, b.hidden_states, atol=1e-4, rtol=0)
