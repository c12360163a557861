"""The drafter's catch-up after rounds without it is timed (`RoundStats.catch_up_time_s`), so the bandit can learn a
drafter arm's round time from a pull among plain rounds without counting what the plain rounds left it to read."""

from __future__ import annotations

import pytest

from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.engine.calibration import ScriptedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.strategy.strategy import DISABLE, Strategy


@pytest.fixture(scope="module")
def models():
    policy = load_model(bundled_model_dir()).eval()
    return policy, load_drafter(bundled_drafter_dir(), policy)[0]


@pytest.mark.parametrize("arm", ["3_1_4", "3_1_4+suffix_8", "suffix_8"])
def test_a_drafter_round_after_plain_rounds_times_its_catch_up(models, arm):
    policy, drafter = models
    strategy = Strategy.parse(arm)
    script = ScriptedSelector([strategy, DISABLE])
    engine = Engine(policy, EngineConfig(max_batch_size=3, max_model_len=256), drafter=drafter, selector=script)
    for seed in range(3):
        engine.add_request(
            [1, 5 + seed, 7, 9, 11], SamplingParams(max_new_tokens=60, temperature=1.0, seed=seed, ignore_eos=True)
        )
    engine.step()  # the prefill (no decode round)
    plan = [strategy, strategy, DISABLE, DISABLE, DISABLE, strategy, strategy, DISABLE, strategy]
    for chosen in plan:
        script.next = chosen
        engine.step()
    rounds = engine.round_stats
    assert [s.strategy for s in rounds] == plan and all(s.batch_size == 3 for s in rounds)
    after_plain = [rounds[i] for i in (5, 8)]
    after_drafter = [rounds[i] for i in (0, 1, 6)]  # after the prefill's catch-up, or a drafter round
    for stats in after_plain:
        if strategy.uses_drafter:
            assert 0.0 < stats.catch_up_time_s < stats.draft_time_s <= stats.wall_time_s
        assert stats.catch_up_time_s < stats.wall_time_s
    if not strategy.is_history:
        assert all(stats.catch_up_time_s == 0.0 for stats in after_drafter)
    assert all(stats.catch_up_time_s == 0.0 for stats in rounds if stats.strategy.is_disabled)
