"""A fused (EAGLE-3 input) drafter in the engine: speculative decoding stays plain decoding token for token (and
transformers' greedy), and the engine hands the drafter exactly the features `policy_features(extra_layers=...)`
computes offline, at prefill, in plain and speculative rounds and after a preempted request is recomputed; the
hidden states a request asks for (co-training's data) are the same features.

The fused drafter has random fuse weights: a feature fed wrong changes its drafts, never the tokens, so the wiring
is checked on the features themselves."""

from __future__ import annotations

import random
import zlib

import pytest
import torch

import fastrl.engine.drafter_feed as drafter_feed_module
import fastrl.speculative.round as round_module
from fastrl.adaptive.fixed import FixedSelector
from fastrl.cotrain.features import policy_features
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafting import catch_up
from tests.engine.test_engine import _hf_greedy, assert_matches_hf
from tests.helpers import make_hf_model
from tests.speculative.fused_helpers import random_fused_drafter

STRATEGIES = ["1_1_2", "3_1_4", "5_4_8", "6_2_12", "4_1_5+suffix_8", "3_3_8+suffix_6"]


@pytest.fixture(scope="module")
def hf_and_policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    hf = make_hf_model("llama", seed=3)
    hf.save_pretrained(path)
    return hf, load_model(path).eval()


def _inputs(vocab: int, count: int, seed: int, new_tokens: int = 24, temperatures=(0.0, 1.0)) -> list[GenerateInput]:
    rng = random.Random(seed)
    prompts: list[list[int]] = []
    out = []
    for i in range(count):
        if prompts and rng.random() < 0.3:  # a GRPO sibling: same prompt, own seed
            prompt = list(rng.choice(prompts))
        else:
            prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 14))]
        prompts.append(prompt)
        params = SamplingParams(
            max_new_tokens=rng.randint(4, new_tokens),
            temperature=rng.choice(temperatures),
            seed=rng.getrandbits(31),
            ignore_eos=True,
        )
        out.append(GenerateInput(prompt, params, request_id=f"r{i}"))
    return out


def test_model_output_features_equal_the_offline_hooks(hf_and_policy):
    _, policy = hf_and_policy
    ids = torch.randint(3, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(9).expand(2, -1)
    for layers in [(), (0,), (1,), (0, 1)]:
        out = policy(ids, positions, feature_layers=layers)
        offline = policy_features(policy, [row.tolist() + [5] for row in ids], extra_layers=layers)
        assert out.features.shape == (2, 9, (len(layers) + 1) * 64)
        for row, seq in enumerate(offline):  # entry i of a FeatureSequence holds the feature of position i
            torch.testing.assert_close(out.features[row], seq.features, rtol=0, atol=1e-5)
        torch.testing.assert_close(out.features[..., -64:], out.hidden, rtol=0, atol=0)
    with pytest.raises(ValueError, match="feature_layers"):
        policy(ids, positions, feature_layers=(2,))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("layers", [(0,), (0, 1)])
def test_fused_drafter_matches_plain(hf_and_policy, strategy, layers):
    _, policy = hf_and_policy
    seed = zlib.crc32(f"{strategy}{layers}".encode()) % 1000
    rng = random.Random(seed)
    inputs = _inputs(policy.config.vocab_size, rng.randint(3, 14), seed)
    drafter = random_fused_drafter(policy.config, layers, seed=seed)
    if rng.random() < 0.5:
        drafter.set_draft_vocab(torch.tensor(sorted(rng.sample(range(97), 30))))
    cfg = EngineConfig(max_batch_size=rng.randint(1, 12), dtype="float64")
    plain = Engine(policy, EngineConfig(max_batch_size=rng.randint(1, 12), dtype="float64")).generate(inputs)
    engine = Engine(policy, cfg, drafter=drafter, selector=FixedSelector(strategy))
    assert engine.runner.feed.features.shape[-1] == (len(layers) + 1) * 64
    spec = engine.generate(inputs)
    for a, b in zip(plain, spec, strict=True):
        assert b.token_ids == a.token_ids
        assert b.logprobs == pytest.approx(a.logprobs, rel=0, abs=1e-9)


def test_fused_drafter_greedy_matches_transformers(hf_and_policy):
    hf, policy = hf_and_policy
    inputs = _inputs(policy.config.vocab_size, 6, seed=8, new_tokens=20, temperatures=(0.0,))
    engine = Engine(
        policy, EngineConfig(max_batch_size=6), random_fused_drafter(policy.config, (0, 1)), FixedSelector("5_2_8")
    )
    for inp, out in zip(inputs, engine.generate(inputs), strict=True):
        theirs, gaps = _hf_greedy(hf, inp.prompt_ids, inp.params.max_new_tokens)
        assert_matches_hf(out.token_ids, theirs, gaps)


class FedEntries:
    """Every entry the drafter reads from the policy (catch-up at prefill, recompute and speculative rounds): per
    request, position p -> (token x_p, feature f_{p-1})."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.entries: dict[str, dict[int, list[tuple[int, torch.Tensor]]]] = {}
        self.calls = 0

    def __call__(self, drafter, policy, dcache, slots, lengths, base, new, first_slot=None, step_kernel=True):
        by_slot = {r.slot: r for r in self.engine.scheduler.running}
        self.calls += 1
        counts, ids = new.counts.tolist(), slots.index.tolist()
        for row, (slot, count) in enumerate(zip(ids, counts, strict=True)):
            request = by_slot[slot]
            first = int(lengths[row]) - count + 1
            for j in range(count):
                seen = self.entries.setdefault(request.request_id, {})
                seen.setdefault(first + j, []).append((int(new.tokens[row, j]), new.features[row, j].clone()))
        return catch_up(drafter, policy, dcache, slots, lengths, base, new, first_slot, step_kernel)


@pytest.mark.parametrize("strategy", ["3_1_4", "4_2_7", "3_1_4+suffix_5"])
def test_engine_feeds_the_offline_features(hf_and_policy, monkeypatch, strategy):
    """Under memory pressure (preemption and recompute), mixed plain and speculative rounds: every entry the
    drafter reads is the token at its position and the offline fused feature of the position before."""
    _, policy = hf_and_policy
    layers = (0, 1)
    inputs = _inputs(policy.config.vocab_size, 16, seed=5, new_tokens=60)
    inputs = [GenerateInput(i.prompt_ids, i.params, i.request_id, return_hidden_states=True) for i in inputs]
    cfg = EngineConfig(max_batch_size=16, dtype="float64", max_model_len=96, page_size=8, kv_cache_tokens=160)
    selector = SwitchEvery(strategy)
    engine = Engine(policy, cfg, random_fused_drafter(policy.config, layers), selector)  # float64 from here
    spy = FedEntries(engine)
    monkeypatch.setattr(round_module, "catch_up", spy)
    monkeypatch.setattr(drafter_feed_module, "catch_up", spy)
    resumed = []
    original_resume = engine.runner.resume
    engine.runner.resume = lambda requests: (resumed.extend(r.request_id for r in requests), original_resume(requests))
    outputs = engine.generate(inputs)
    assert engine.scheduler.preemptions > 0 and resumed and selector.plain_rounds > 0
    sequences = [out.prompt_ids + out.token_ids for out in outputs]
    offline = policy_features(policy, sequences, extra_layers=layers)  # float64 forward, float32 features
    checked = 0
    for out, seq, want in zip(outputs, sequences, offline, strict=True):
        fed = spy.entries[out.request_id]
        assert min(fed) == 1  # the whole prompt was fed
        for position, reads in fed.items():
            for token, feature in reads:  # a recomputed request reads its positions again: each read is checked
                assert token == seq[position]
                torch.testing.assert_close(feature.float(), want.features[position - 1])
                checked += 1
        # The hidden states returned (co-training's features) are the same fused features, prompt and output.
        kept = torch.cat([out.prompt_hidden_states, out.hidden_states])
        torch.testing.assert_close(kept, want.features)
    assert checked > sum(len(s) for s in sequences) // 2
    assert any(r in spy.entries for r in resumed)


class SwitchEvery:
    """Plain every third round, the strategy otherwise: plain rounds' features must reach the drafter too."""

    def __init__(self, strategy: str) -> None:
        from fastrl.strategy.strategy import DISABLE, Strategy

        self._spec, self._plain = Strategy.parse(strategy), DISABLE
        self.rounds = 0
        self.plain_rounds = 0

    @property
    def strategies(self):
        return [self._spec, self._plain]

    def choose(self, batch_size: int):
        self.rounds += 1
        if self.rounds % 3 == 0:
            self.plain_rounds += 1
            return self._plain
        return self._spec

    def observe(self, stats) -> None:
        """Learns nothing."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore."""
