"""A stopping chain's round records the levels its chain drafted (``RoundStats.chain_depth``): a hybrid's history
nodes are no levels. The bandit took a hybrid's drafted nodes (chain and history) for its depth, 9 levels for a
3-step chain, which skewed the shared load of every arm and the plain-time (speedup) estimate."""

from __future__ import annotations

import random

import pytest

from fastrl.adaptive.factory import build_selector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import Strategy


@pytest.fixture(scope="module")
def models():
    policy = load_model(bundled_model_dir()).eval()
    return policy, load_drafter(bundled_drafter_dir(), policy)[0]


@pytest.mark.parametrize("name", ["3_1_4@0.5+suffix_8", "5_1_6@0.3+suffix_4", "4_1_5@0.4"])
@pytest.mark.parametrize("seed", [0, 1])
def test_rounds_record_the_chain_levels_and_the_bandit_learns_them(models, name, seed):
    policy, drafter = models
    rng = random.Random(seed)
    pattern = [rng.randrange(3, 40) for _ in range(rng.randint(3, 7))]
    inputs = [
        GenerateInput([1, *(pattern * 4)], SamplingParams(max_new_tokens=40, temperature=t, seed=i))
        for i, t in enumerate(rng.choice([[0.0], [0.0, 1.0], [1.0, 1.0, 0.0]]))
    ]
    arm = Strategy.parse(name)
    selector = build_selector("bandit", bandit={"strategies": [name, "disable"], "calibrate": False})
    engine = Engine(policy, EngineConfig(max_batch_size=3, max_model_len=256), drafter, selector)
    engine.generate(inputs)
    rounds = [s for s in engine.round_stats if s.strategy == arm]
    assert rounds
    for stats in rounds:
        assert 1 <= stats.chain_depth <= arm.steps and stats.stopped_depth == stats.chain_depth
        history = stats.drafted_tokens[0] - stats.chain_depth  # the merged tree's other nodes
        assert history >= 0 if arm.is_history else history == 0
    assert all(s.chain_depth is None for s in engine.round_stats if s.strategy != arm)
    for batch in {s.batch_size for s in rounds}:
        assert 1 <= selector.reached_depth(arm, batch) <= arm.steps


def test_a_chain_depth_outside_the_chain_is_refused():
    hybrid = Strategy.parse("3_1_4@0.5+suffix_8")
    RoundStats(hybrid, 1, [9], [2], [3], 0.01, chain_depth=3)
    for bad, strategy in [(9, hybrid), (0, hybrid), (2, Strategy.parse("3_1_4"))]:
        with pytest.raises(ValueError, match="RoundStats.chain_depth must be None"):
            RoundStats(strategy, 1, [9], [2], [3], 0.01, chain_depth=bad)
    older = RoundStats(Strategy.parse("3_1_4@0.5"), 1, [2], [1], [2], 0.01)  # a log written before it was kept
    assert older.stopped_depth == 2 and RoundStats(hybrid, 1, [9], [2], [3], 0.01).stopped_depth is None
