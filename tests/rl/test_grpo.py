"""GRPO's tensor functions: advantages, the clipped surrogate (sign, clipping, aggregation), the k3 KL."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from fastrl.rl.grpo import clipped_policy_loss, drift_kl, group_advantages, kl_k3, token_mean
from fastrl.rl.logprobs import pack_sequences, plan_micro_batches, response_logprobs
from fastrl.sampling.params import SamplingParams
from tests.rl.grpo_setup import tiny_policy


def test_advantages_are_zero_mean_unit_std_per_group():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 0.4, 0.9, 0.1], [3.0, 3.0, 3.0, 3.0]])
    adv = group_advantages(rewards)
    assert adv.shape == (3, 4)
    torch.testing.assert_close(adv.mean(dim=1), torch.zeros(3), atol=1e-6, rtol=0)
    torch.testing.assert_close(adv[:2].std(dim=1), torch.ones(2), atol=1e-4, rtol=0)
    assert torch.equal(adv[2], torch.zeros(4))
    assert (adv[0] > 0).tolist() == [True, False, False, True]
    assert adv[1].argmax() == 2 and adv[1].argmin() == 3


def test_constant_rewards_give_exactly_zero_advantage():
    rewards = torch.full((5, 8), 0.1) * torch.arange(5).float()[:, None]  # values whose mean is not exact
    for scale in (True, False):
        assert torch.equal(group_advantages(rewards, scale_by_std=scale), torch.zeros(5, 8))


def test_unscaled_advantages_are_centered_rewards():
    rewards = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    torch.testing.assert_close(group_advantages(rewards, scale_by_std=False), torch.tensor([[-0.75, 0.25, 0.25, 0.25]]))
    with pytest.raises(ValueError, match="n >= 2"):
        group_advantages(torch.ones(3, 1))


def test_token_mean_weighs_every_token_equally():
    values = torch.tensor([[1.0, 9.0, 9.0], [2.0, 4.0, float("nan")]])
    mask = torch.tensor([[True, False, False], [True, True, False]])
    assert float(token_mean(values, mask)) == pytest.approx((1 + 2 + 4) / 3)
    assert float(token_mean(values, mask, normalizer=7.0)) == pytest.approx(1.0)


def _sequence_logprob_sum(policy, batch) -> float:
    with torch.no_grad():
        return float(response_logprobs(policy, batch)[batch.response_mask].sum())


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_advantage_sign_moves_sampled_tokens_logprobs(sign):
    policy = tiny_policy(seed=1)
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7)]
    batch = pack_sequences([[1, 20, 30, 40], [1, 22]], [[50, 51, 52, 2], [60, 61]], params)
    old = response_logprobs(policy, batch).detach()
    before = _sequence_logprob_sum(policy, batch)
    loss = clipped_policy_loss(response_logprobs(policy, batch), old, torch.full((2,), sign), batch.response_mask, 0.2)
    assert float(loss.loss.detach()) == pytest.approx(-sign)  # ratio = 1 on the first pass: loss = -mean(A)
    loss.loss.backward()
    with torch.no_grad():
        for p in policy.parameters():
            p -= 0.05 * p.grad
    after = _sequence_logprob_sum(policy, batch)
    assert (after - before) * sign > 1e-3


def test_clipping_stops_the_gradient_beyond_the_range():
    eps = 0.2
    log_ratios = torch.tensor([0.5, -0.5, 0.05, 0.5, -0.5])  # ratios 1.65, 0.61, 1.05, 1.65, 0.61
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])
    logp_new = log_ratios.clone().view(5, 1).requires_grad_(True)
    out = clipped_policy_loss(logp_new, torch.zeros(5, 1), advantages, torch.ones(5, 1, dtype=torch.bool), eps)
    out.loss.backward()
    grad = logp_new.grad.view(-1)
    # beyond the range in the advantage's direction: clipped, no gradient
    assert grad[0] == 0 and grad[1] == 0
    # inside the range, or beyond it against the advantage: the unclipped term, gradient -A * ratio / tokens
    expected = -advantages[2:] * log_ratios[2:].exp() / 5
    torch.testing.assert_close(grad[2:], expected)
    assert float(out.clip_fraction) == pytest.approx(2 / 5)


def test_clip_higher_widens_the_upper_bound_only():
    logp_new = torch.tensor([[0.25]], requires_grad=True)  # ratio 1.28
    out = clipped_policy_loss(logp_new, torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1, dtype=torch.bool), 0.2, 0.3)
    out.loss.backward()
    assert float(logp_new.grad) != 0.0 and float(out.clip_fraction) == 0.0


def test_padding_and_filtered_tokens_never_give_nan():
    logp_new = torch.tensor([[-1.0, float("-inf"), float("nan")]], requires_grad=True)
    logp_old = torch.tensor([[-1.0, float("-inf"), 0.0]])
    mask = torch.tensor([[True, True, False]])  # a token both policies filter out; padding
    out = clipped_policy_loss(logp_new, logp_old, torch.ones(1), mask, 0.2)
    out.loss.backward()
    assert float(out.loss.detach()) == -1.0 and torch.isfinite(logp_new.grad).all()


def test_kl_is_zero_with_zero_gradient_when_policy_equals_reference():
    policy = tiny_policy(seed=2)
    reference = copy.deepcopy(policy).requires_grad_(False)
    batch = pack_sequences([[1, 5, 6]], [[7, 8, 9, 2]], [SamplingParams(temperature=0.9, top_p=0.95)])
    logp = response_logprobs(policy, batch)
    with torch.no_grad():
        ref = response_logprobs(reference, batch)
    kl = token_mean(kl_k3(logp, ref, batch.response_mask), batch.response_mask)
    assert float(kl.detach()) == 0.0
    kl.backward()
    assert all(float(p.grad.abs().max()) == 0.0 for p in policy.parameters() if p.grad is not None)


def test_kl_is_positive_where_policies_differ_and_zero_where_a_filter_excludes_the_token():
    new = torch.tensor([[-1.0, -2.0, float("-inf"), -3.0, float("-inf"), -1.0]])
    ref = torch.tensor([[-1.5, -0.5, -1.0, float("-inf"), float("-inf"), -1.0]])
    mask = torch.tensor([[True, True, True, True, True, True]])
    k3 = kl_k3(new, ref, mask)
    d = torch.tensor([-0.5, 1.5])
    torch.testing.assert_close(k3[0, :2], d.exp() - d - 1)
    assert (k3[0, :2] > 0).all() and torch.equal(k3[0, 2:], torch.zeros(4))


def test_micro_batched_gradient_equals_full_batch_gradient():
    """Accumulating micro-batches that pass the whole batch's token count as normaliser gives the full gradient."""
    policy = tiny_policy(seed=3)
    prompts = [[1, 10 + i, 11 + i] for i in range(5)]
    responses = [[20 + j for j in range(1 + 2 * i)] for i in range(5)]
    batch = pack_sequences(prompts, responses, [SamplingParams(temperature=0.8)] * 5)
    advantages = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.4])
    old = response_logprobs(policy, batch).detach() - 0.05  # ratios != 1, some clipped

    def grads(max_tokens: int) -> list[torch.Tensor]:
        policy.zero_grad()
        lengths = (batch.prompt_lengths + batch.response_mask.sum(1)).tolist()
        for rows in plan_micro_batches(lengths, [4, 0, 2, 1, 3], max_tokens):
            index = torch.tensor(rows)
            sub = batch.select(index)
            width = sub.response_mask.shape[1]
            out = clipped_policy_loss(
                response_logprobs(policy, sub),
                old[index, :width],
                advantages[index],
                sub.response_mask,
                0.2,
                normalizer=batch.num_tokens,
            )
            out.loss.backward()
        return [p.grad.clone() for p in policy.parameters()]

    for a, b in zip(grads(1), grads(10_000), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_micro_batch_plan_respects_the_token_budget():
    lengths = [3, 9, 4, 12, 2, 2, 2]
    plan = plan_micro_batches(lengths, list(range(7)), 12)
    assert [i for rows in plan for i in rows] == list(range(7))
    assert all(len(rows) * max(lengths[i] for i in rows) <= 12 or len(rows) == 1 for rows in plan)
    assert plan_micro_batches(lengths, [3], 5) == [[3]]  # longer than the budget: alone


def test_drift_kl_is_the_mean_log_ratio_over_tokens_both_policies_can_sample():
    """A token that the reference's top-k / top-p filter excludes (log-prob -inf) made the drift figure inf for
    the whole step; it is left out, as in kl_k3, and padding never counts."""
    policy = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-1.0, float("-inf"), -2.0, -4.0]])
    ref = torch.tensor([[-1.5, float("-inf"), -0.5, -9.0], [-0.5, -1.0, -2.5, -4.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    kept = [0.5, 0.0, -0.5, 0.5, 0.0]  # rows' tokens with both log-probs finite, inside the mask
    assert drift_kl(policy, ref, mask) == pytest.approx(sum(kept) / len(kept))
    assert drift_kl(policy, ref, torch.zeros_like(mask)) == 0.0
    generator = torch.Generator().manual_seed(5)
    for _ in range(20):  # random filters: finite whenever any token qualifies, and the plain mean without filters
        a, b = torch.randn(3, 7, generator=generator), torch.randn(3, 7, generator=generator)
        m = torch.rand(3, 7, generator=generator) < 0.8
        assert drift_kl(a, b, m) == pytest.approx(float((a - b)[m].mean()) if m.any() else 0.0, abs=1e-6)
        cut = torch.rand(3, 7, generator=generator) < 0.3
        value = drift_kl(a, b.masked_fill(cut, float("-inf")), m)
        assert math.isfinite(value)
        assert value == pytest.approx(float((a - b)[m & ~cut].mean()) if (m & ~cut).any() else 0.0, abs=1e-6)
