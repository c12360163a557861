"""Prefix sharing: identical prompts admitted together prefill once and copy the KV; outputs are unchanged."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from tests.helpers import FLOAT64_LOGPROB_TOL, make_hf_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_hf_model("llama", seed=4).save_pretrained(path)
    return load_model(path).double()


def _groups(vocab: int, prompts: int, n: int, seed: int, shuffle: bool) -> list[GenerateInput]:
    rng = random.Random(seed)
    out = []
    for p in range(prompts):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 12))]
        for i in range(n):
            new = rng.randint(1, 16)
            params = SamplingParams(max_new_tokens=new, temperature=rng.choice([0.0, 1.0]), seed=p * n + i)
            out.append(GenerateInput(prompt, params, request_id=f"p{p}-s{i}", return_hidden_states=i == 0))
    if shuffle:
        rng.shuffle(out)
    return out


def _run(model, inputs, sharing: bool, batch_size: int, strategy: str = "disable", drafter=None):
    config = EngineConfig(max_batch_size=batch_size, dtype="float64", prefix_sharing=sharing)
    engine = Engine(model, config, drafter=drafter, selector=FixedSelector(strategy))
    return engine, engine.generate(inputs)


@settings(max_examples=12, deadline=None)
@given(
    prompts=st.integers(1, 4),
    n=st.integers(1, 5),
    batch_size=st.integers(1, 12),
    seed=st.integers(0, 10_000),
    shuffle=st.booleans(),
)
def test_sharing_changes_nothing_but_the_work(model, prompts, n, batch_size, seed, shuffle):
    inputs = _groups(model.config.vocab_size, prompts, n, seed, shuffle)
    plain_engine, plain = _run(model, inputs, False, batch_size)
    shared_engine, shared = _run(model, inputs, True, batch_size)
    for a, b in zip(plain, shared, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, rel=0, abs=FLOAT64_LOGPROB_TOL)
        if a.hidden_states is not None:
            assert torch.equal(a.prompt_hidden_states, b.prompt_hidden_states)
            assert torch.equal(a.hidden_states, b.hidden_states)
    assert plain_engine.prefill_rows.computed == plain_engine.prefill_rows.prompts == len(inputs)
    assert shared_engine.prefill_rows.prompts == len(inputs)
    assert prompts <= shared_engine.prefill_rows.computed <= len(inputs)
    if batch_size >= len(inputs):  # one admission: each distinct prompt runs exactly once
        assert shared_engine.prefill_rows.computed == prompts


def test_sharing_under_speculation(model):
    torch.manual_seed(0)
    drafter = EagleDrafter(model.config).double()
    inputs = _groups(model.config.vocab_size, 3, 4, seed=1, shuffle=True)
    _, plain = _run(model, inputs, False, 12)
    engine, spec = _run(model, inputs, True, 12, "4_2_8", drafter)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert engine.prefill_rows.computed == 3
