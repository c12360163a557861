"""Recomputed log-probs equal the engine's rollout log-probs (every sampling setting, plain and speculative
decoding); a policy that differs from the rollout's is caught by the consistency check."""

from __future__ import annotations

import math
import random

import pytest
import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.rl.logprob_check import LogprobMismatchError, compare_logprobs, require_consistent, rollout_tolerance
from fastrl.rl.logprobs import batched_logprobs, pack_sequences
from fastrl.rl.trainer_config import GRPOConfig
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from tests.rl.grpo_setup import tiny_policy
from tests.speculative.exactness_cases import random_strategy

SETTINGS = [
    dict(temperature=0.0),  # greedy: both sides report T = 1 log-probs
    dict(temperature=1.0),
    dict(temperature=0.7, top_p=0.9),
    dict(temperature=1.0, top_k=20),
    dict(temperature=1.3, top_k=30, top_p=0.8),
]


def _inputs(vocab: int, count: int = 10) -> list[GenerateInput]:
    g = torch.Generator().manual_seed(5)
    out = []
    for i in range(count):
        prompt = [1] + torch.randint(3, vocab, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
        params = SamplingParams(max_new_tokens=6 + 2 * i, seed=900 + i, **SETTINGS[i % len(SETTINGS)])
        out.append(GenerateInput(prompt, params, request_id=f"r{i}"))
    return out


def _rollout_tensor(outputs, shape) -> torch.Tensor:
    values = torch.zeros(shape)
    for row, out in enumerate(outputs):
        values[row, : len(out.logprobs)] = torch.tensor(out.logprobs)
    return values


@pytest.mark.parametrize(
    "tied, strategy", [(False, "disable"), (True, "disable"), (False, "3_2_6")], ids=["plain", "tied", "speculative"]
)
def test_recomputed_logprobs_equal_rollout_logprobs(tied, strategy):
    policy = tiny_policy(seed=4, tied=tied)
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config) if strategy != "disable" else None
    engine = Engine(policy, EngineConfig(max_batch_size=8), drafter=drafter, selector=FixedSelector(strategy))
    inputs = _inputs(policy.config.vocab_size)
    outputs = engine.generate(inputs)
    assert all(out.token_ids for out in outputs)
    batch = pack_sequences([o.prompt_ids for o in outputs], [o.token_ids for o in outputs], [i.params for i in inputs])
    recomputed = batched_logprobs(policy, batch, max_tokens=40)  # several micro-batches
    rollout = _rollout_tensor(outputs, recomputed.shape)
    mask = batch.response_mask
    assert torch.isfinite(recomputed[mask]).all() and (recomputed[mask] <= 0).all()
    assert (recomputed[~mask] == 0).all()
    torch.testing.assert_close(recomputed[mask], rollout[mask], atol=1e-4, rtol=0)
    check = compare_logprobs(rollout, recomputed, mask)
    assert check.max_abs_diff < 1e-4 and check.mean_abs_diff <= check.max_abs_diff
    require_consistent(check, 1e-4)


@pytest.mark.parametrize("seed", range(8))
def test_rollout_logprobs_equal_trainer_logprobs_for_random_strategies(seed):
    """fp32 rollouts under random strategies (chains and trees of any shape) against the trainer's recompute."""
    rng = random.Random(seed)
    policy = tiny_policy(seed=4, tied=seed % 2 == 1)
    strategy = random_strategy(rng, policy.config.vocab_size)
    torch.manual_seed(seed)
    engine = Engine(
        policy,
        EngineConfig(max_batch_size=rng.randint(1, 10)),
        drafter=EagleDrafter(policy.config),
        selector=FixedSelector(strategy),
    )
    inputs = _inputs(policy.config.vocab_size)
    outputs = engine.generate(inputs)
    batch = pack_sequences([o.prompt_ids for o in outputs], [o.token_ids for o in outputs], [i.params for i in inputs])
    recomputed = batched_logprobs(policy, batch, max_tokens=64)
    check = compare_logprobs(_rollout_tensor(outputs, recomputed.shape), recomputed, batch.response_mask)
    assert check.max_abs_diff <= 1e-5, f"strategy {strategy}"


def test_greedy_logprobs_are_the_temperature_one_ones():
    policy = tiny_policy(seed=6)
    batch = pack_sequences([[1, 5, 6]] * 2, [[7, 8, 9]] * 2, [SamplingParams(temperature=0.0), SamplingParams()])
    values = batched_logprobs(policy, batch, max_tokens=100)
    torch.testing.assert_close(values[0], values[1], atol=0, rtol=0)


def test_other_weights_or_settings_fail_the_check():
    policy = tiny_policy(seed=7)
    inputs = _inputs(policy.config.vocab_size, count=6)
    outputs = Engine(policy, EngineConfig(max_batch_size=8)).generate(inputs)
    prompts, responses = [o.prompt_ids for o in outputs], [o.token_ids for o in outputs]
    batch = pack_sequences(prompts, responses, [i.params for i in inputs])
    rollout = _rollout_tensor(outputs, batch.response_mask.shape)

    stale = tiny_policy(seed=7)
    with torch.no_grad():
        stale.model.layers[0].mlp.down_proj.weight.add_(0.05)
    check = compare_logprobs(rollout, batched_logprobs(stale, batch, 1000), batch.response_mask)
    assert check.max_abs_diff > 1e-3
    with pytest.raises(LogprobMismatchError, match="logprob_tolerance=0.001"):
        require_consistent(check, 1e-3, "step 3")
    require_consistent(check, math.inf)  # report only

    hotter = pack_sequences(prompts, responses, [SamplingParams(temperature=1.5)] * len(inputs))
    check = compare_logprobs(rollout, batched_logprobs(policy, hotter, 1000), batch.response_mask)
    with pytest.raises(LogprobMismatchError):
        require_consistent(check, 1e-3)


def test_non_finite_differences_always_fail():
    rollout = torch.tensor([[-1.0, -2.0]])
    recomputed = torch.tensor([[-1.0, float("-inf")]])
    check = compare_logprobs(rollout, recomputed, torch.ones(1, 2, dtype=torch.bool))
    assert check.max_abs_diff == math.inf and (check.worst_row, check.worst_token) == (0, 1)
    with pytest.raises(LogprobMismatchError):
        require_consistent(check, 1e3)


def test_the_default_tolerance_follows_the_rollout_dtype():
    assert rollout_tolerance(None) == rollout_tolerance(torch.float32) == rollout_tolerance(torch.float64) == 1e-3
    assert rollout_tolerance(torch.bfloat16) == 0.25 and rollout_tolerance(torch.float16) == 0.05


@pytest.mark.parametrize(("temperature", "scale"), [(1.0, 1.0), (2.0, 1.0), (0.5, 2.0), (0.1, 10.0), (0.0, 1.0)])
def test_rollout_tolerance_scales_with_low_temperature(temperature, scale):
    """A bfloat16 rollout at T = 0.1 differed from the float32 recomputation by 0.375 (logits divided by T scale
    the rounding by 1/T) and `fastrl train` stopped at step 1 blaming stale weights, with a tolerance of 0.25."""
    assert rollout_tolerance(torch.bfloat16, temperature) == pytest.approx(0.25 * scale)
    assert rollout_tolerance(torch.float32, temperature) == pytest.approx(1e-3 * scale)
    assert rollout_tolerance(None, temperature) == 1e-3  # unknown dtype: the trainer's float32 rounding
    assert GRPOConfig(logprob_tolerance=None).logprob_tolerance is None
    with pytest.raises(ValueError, match="logprob_tolerance"):
        GRPOConfig(logprob_tolerance=-1.0)


def test_a_float64_policy_recomputes_in_float64():
    """The micro-batches' result was float32 whatever the policy, and a float64 policy's parts failed to go in."""
    policy = tiny_policy(seed=0, vocab_size=20).double()
    prompts, responses = [[3, 4], [5], [6, 7, 8]], [[6, 7], [8, 9, 10], [11]]
    batch = pack_sequences(prompts, responses, [SamplingParams(max_new_tokens=4, seed=i) for i in range(3)])
    both = batched_logprobs(policy, batch, max_tokens=5)  # several micro-batches
    assert both.dtype == torch.float64
    one_by_one = [
        batched_logprobs(policy, pack_sequences([p], [r], [SamplingParams()]), 10**6)
        for p, r in zip(prompts, responses, strict=True)
    ]
    for row, alone in enumerate(one_by_one):
        torch.testing.assert_close(both[row, : alone.shape[1]], alone[0], atol=1e-12, rtol=0)
