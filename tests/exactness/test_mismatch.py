"""First-mismatch judgement: a swap of the two best perturbed tokens is a near-tie only under a bound above their
gap; a token the processed distribution excludes, or a stop in one run only, is always a bug."""

from __future__ import annotations

import torch

from fastrl.exactness.mismatch import MISSING, analyse_mismatch, first_difference, near_tie_bound
from fastrl.sampling.params import SamplingParams
from fastrl.sampling.sampler import SamplingBatch, perturbed_logits
from tests.rl.grpo_setup import tiny_policy


def _top2(policy, context, params, seed):
    logits = policy(torch.tensor([context]), torch.arange(len(context)).unsqueeze(0)).logits[:, -1]
    batch = SamplingBatch.from_params([params], [seed])
    perturbed = perturbed_logits(logits, batch, torch.tensor([len(context)]))[0]
    top = torch.topk(perturbed, 2)
    return top.indices.tolist(), float(top.values[0] - top.values[1]), perturbed


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 7]) == 2


@torch.inference_mode()
def test_swap_of_the_top_two_is_a_near_tie_only_below_the_bound():
    policy = tiny_policy(seed=3)
    prompt, plain = [1, 5, 9, 4], [7, 8]
    for params, seed in ((SamplingParams(temperature=0.9), 17), (SamplingParams(temperature=0.0), 0)):
        (best, second), gap, _ = _top2(policy, prompt + plain, params, seed)
        assert gap > 0
        ours, theirs = plain + [best, 3], plain + [second, 3]
        wide = analyse_mismatch(policy, prompt, ours, theirs, params, seed, bound=gap * 2)
        assert wide is not None and wide.position == 2 and wide.near_tie and wide.kind == "near-tie"
        assert (wide.plain_token, wide.spec_token) == (best, second)
        assert abs(wide.gap - gap) < 1e-5 and 0 < wide.spec_prob <= 1
        narrow = analyse_mismatch(policy, prompt, ours, theirs, params, seed, bound=gap / 2)
        assert narrow is not None and not narrow.near_tie and narrow.kind == "bug"
        assert analyse_mismatch(policy, prompt, ours, list(ours), params, seed, bound=1.0) is None


@torch.inference_mode()
def test_tokens_outside_the_filter_and_early_stops_are_bugs():
    policy = tiny_policy(seed=4)
    prompt = [1, 6, 6, 2 + 7]
    params = SamplingParams(temperature=1.0, top_k=2)
    (best, second), _, perturbed = _top2(policy, prompt, params, 5)
    excluded = int(torch.argmin(perturbed))
    m = analyse_mismatch(policy, prompt, [best], [excluded], params, 5, bound=1e9)
    assert m is not None and m.kind == "bug" and m.spec_prob == 0.0
    stop = analyse_mismatch(policy, prompt, [best, 4], [best], params, 5, bound=1e9)
    assert stop is not None and stop.position == 1 and stop.spec_token == MISSING and stop.kind == "bug"


def test_bound_scales_with_temperature_and_dtype():
    assert near_tie_bound(torch.float32, 0.5) == 2 * near_tie_bound(torch.float32, 1.0)
    assert near_tie_bound(torch.float32, 0.0) == near_tie_bound(torch.float32, 1.0)
    assert near_tie_bound(torch.float64, 1.0) < near_tie_bound(torch.float32, 1.0) < near_tie_bound(torch.bfloat16, 1)
