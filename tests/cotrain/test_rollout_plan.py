"""The plan of drafter training's rollouts: a greedy pass draws one sample a prompt (its samples were alike, n
times the generation for duplicated data), a pass above 0 draws `samples`, every request once with its own seed."""

from __future__ import annotations

import random

import pytest

from fastrl.cotrain.rollout_plan import RolloutPlan


@pytest.mark.parametrize("seed", range(6))
def test_every_request_once_and_a_greedy_pass_one_sample_a_prompt(seed):
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 90) for _ in range(rng.randint(1, 5))] for _ in range(rng.randint(1, 7))]
    temperatures = rng.sample([0.0, 0.7, 1.0, 1.3], rng.randint(1, 4))
    samples = rng.randint(1, 4)
    plan = RolloutPlan(prompts, temperatures, samples, max_new_tokens=8, seed=seed)
    requests = [plan.request(r) for r in range(len(plan))]
    expected = [(t, i) for t in temperatures for i in range(len(prompts)) for _ in range(1 if t == 0 else samples)]
    assert [(q.params.temperature, prompts.index(q.prompt_ids)) for q in requests] == [
        (t, prompts.index(prompts[i])) for t, i in expected
    ]
    assert len({q.params.seed for q in requests}) == len(requests)
    with pytest.raises(IndexError):
        plan.request(len(plan))


def test_a_stream_whose_greedy_pass_drew_every_sample_is_refused_not_misread(tmp_path):
    """Streams saved before drew `samples` alike greedy samples a prompt: their shards number the requests otherwise,
    so resuming one with a greedy pass and samples > 1 is refused naming the setting; any other stream resumes."""
    from fastrl.cotrain.rollout_plan import GREEDY_PASS
    from fastrl.cotrain.stream_trainer import check_settings

    saved = {"samples_per_prompt": 2, "rollout_temperatures": [0.0, 1.0]}
    with pytest.raises(ValueError, match=r"other settings \(greedy_pass\)"):
        check_settings(tmp_path, saved, {**saved, "greedy_pass": GREEDY_PASS})
    check_settings(tmp_path, saved, dict(saved))  # no greedy pass of several samples: nothing to tell apart
    check_settings(tmp_path, {**saved, "greedy_pass": GREEDY_PASS}, {**saved, "greedy_pass": GREEDY_PASS})


def test_held_out_accept_requests_draw_other_noise_than_every_rollout():
    """train-drafter's accept-length requests had seeds 0..n-1, the first training rollouts' own with seed=0: a
    held-out prompt of a training prompt's length drew the same noise at every position (57% equal tokens against
    28% with other seeds)."""
    from fastrl.cotrain.offline import OfflineDrafterConfig, accept_inputs
    from fastrl.cotrain.rollout_plan import RolloutPlan

    for seed in (0, 1, 7):
        cfg = OfflineDrafterConfig(seed=seed, accept_requests=64)
        held = {x.params.seed for x in accept_inputs([[5, 6]] * 64, 1.0, cfg)}
        assert len(held) == 64
        for plan_seed in (seed, seed + 1):  # the training rollouts', the held-out rollouts'
            plan = RolloutPlan([[5, 6]] * 300, [0.0, 1.0], 2, 8, plan_seed)
            assert held.isdisjoint(plan.request(r).params.seed for r in range(len(plan)))
