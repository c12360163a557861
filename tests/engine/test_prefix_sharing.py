"""Prefix sharing: identical prompts admitted together prefill once and copy the KV; outputs are unchanged.

With a drafter, its prompt catch-up runs once per distinct prompt too: the siblings' drafter entries (shared full
pages, a copy of the partial last page made after the catch-up) are bitwise those of an unshared prefill."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fastrl.engine.drafter_feed as drafter_feed_module
from fastrl.adaptive.fixed import FixedSelector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.engine.prefill_groups import length_groups
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.rl.tasks.task import ArithChainTask
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.speculative.drafting import catch_up
from tests.helpers import FLOAT64_LOGPROB_TOL, last_layer_drafter, make_hf_model


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


@pytest.fixture(scope="module")
def bundled():
    """The bundled policy and its two drafters in float64: the shipped fused one (EAGLE-3 input, extra_layers) and
    its last-layer part (a plain EAGLE drafter)."""
    policy = load_model(bundled_model_dir()).double().eval()
    fused = load_drafter(bundled_drafter_dir(), policy)[0].double().eval()
    assert fused.extra_layers
    return policy, {"fused": fused, "eagle": last_layer_drafter(policy).double().eval()}


def _prefilled(policy, drafter, inputs, sharing: bool, page_size: int) -> Engine:
    config = EngineConfig(max_batch_size=len(inputs), dtype="float64", page_size=page_size, prefix_sharing=sharing)
    engine = Engine(policy, config, drafter=drafter, selector=FixedSelector("3_1_4"))
    for i in inputs:
        engine.add_request(i.prompt_ids, i.params, i.request_id)
    engine.step()  # admission and prefill only: nobody was running
    return engine


@pytest.mark.parametrize("kind", ["eagle", "fused"])
@pytest.mark.parametrize("page_size", [4, 8])
def test_siblings_drafter_entries_are_bitwise_an_unshared_prefill(bundled, kind, page_size):
    policy, drafters = bundled
    rng = random.Random(page_size)
    lengths = [13, 16, 5, 8, 3]  # mid-page and on a page boundary for both page sizes, shorter than a page
    prompts = [[rng.randrange(3, policy.config.vocab_size) for _ in range(n)] for n in lengths]
    params = [SamplingParams(max_new_tokens=4, temperature=1.0, seed=s, ignore_eos=True) for s in range(3)]
    inputs = [GenerateInput(p, q, request_id=f"p{i}-s{j}") for i, p in enumerate(prompts) for j, q in enumerate(params)]
    shared = _prefilled(policy, drafters[kind], inputs, True, page_size)
    alone = _prefilled(policy, drafters[kind], inputs, False, page_size)
    assert shared.prefill_rows.computed == len(prompts) and alone.prefill_rows.computed == len(inputs)
    by_id = {r.request_id: r for r in shared.scheduler.running}
    alone_by_id = {r.request_id: r for r in alone.scheduler.running}
    for p, n in enumerate(lengths):
        rows = [by_id[f"p{p}-s{j}"] for j in range(len(params))]
        pages = [shared.runner.pool.pages_of(r.slot) for r in rows]
        full = n // page_size
        assert all(q[:full] == pages[0][:full] for q in pages)  # full pages held by reference
        if n % page_size:
            assert len({q[full] for q in pages}) == len(rows)  # each sibling's partial last page is its own copy
        for r in rows:
            mine, theirs = r.slot, alone_by_id[r.request_id].slot
            k, v = shared.runner.spec_models.dcache.read(0, torch.tensor([mine]), n)
            k_alone, v_alone = alone.runner.spec_models.dcache.read(0, torch.tensor([theirs]), n)
            assert torch.equal(k[:, :, 1:], k_alone[:, :, 1:]) and torch.equal(v[:, :, 1:], v_alone[:, :, 1:])
            assert k[:, :, 1:].abs().sum() > 0
            feed, feed_alone = shared.runner.feed, alone.runner.feed  # every row's own pending root
            assert feed._pending[mine] == feed_alone._pending[theirs] == 1
            assert int(feed.tokens[mine, 0]) == int(feed_alone.tokens[theirs, 0]) == r.output_ids[0]
            assert torch.equal(feed.features[mine, 0], feed_alone.features[theirs, 0])


class PrefillCatchUpRows:
    """The rows of every drafter catch-up at prefill or recompute (`feed_prompts`), then the catch-up itself."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def __call__(self, drafter, policy, dcache, slots, lengths, base, new, step_kernel=True):
        self.rows.append(new.tokens.shape[0])
        return catch_up(drafter, policy, dcache, slots, lengths, base, new, step_kernel=step_kernel)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("strategy", ["3_1_4", "8_4_32"])
def test_grpo_groups_under_speculation_equal_plain_decoding(bundled, monkeypatch, strategy, temperature):
    """4 task prompts x 4 samples (own seeds): the drafter catches up over the 4 prompts' rows only, the tokens
    are plain decoding's, and the drafts are those of the unshared engine (the same accept lengths)."""
    policy, drafters = bundled
    rng = random.Random(7)
    tokenizer = load_tokenizer(bundled_model_dir())
    prompts = [tokenizer(ArithChainTask().sample_problem(rng).prompt)["input_ids"] for _ in range(4)]
    inputs = [
        GenerateInput(p, SamplingParams(max_new_tokens=40, temperature=temperature, seed=10 * i + j), f"p{i}-s{j}")
        for i, p in enumerate(prompts)
        for j in range(4)
    ]
    _, plain = _run(policy, inputs, False, len(inputs))
    _, unshared = _run(policy, inputs, False, len(inputs), strategy, drafters["fused"])
    spy = PrefillCatchUpRows()
    monkeypatch.setattr(drafter_feed_module, "catch_up", spy)
    engine, spec = _run(policy, inputs, True, len(inputs), strategy, drafters["fused"])
    # one prefill; the catch-ups (one per group of similar prompt lengths) run one row per distinct prompt
    assert sum(spy.rows) == len(prompts) and len(spy.rows) == len(length_groups([len(p) for p in prompts]))
    assert engine.prefill_rows.computed == len(prompts)
    for a, b, c in zip(plain, spec, unshared, strict=True):
        assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason
        assert b.logprobs == pytest.approx(a.logprobs, rel=0, abs=FLOAT64_LOGPROB_TOL)
        assert b.accept_lengths == c.accept_lengths
    assert sum(sum(o.accept_lengths) - len(o.accept_lengths) for o in spec) > 0  # drafts were accepted
