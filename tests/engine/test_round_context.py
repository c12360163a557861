"""Every decode round records the keys its rows hold (`RoundStats.context_tokens`): the context a selector's cost
model prices the round at."""

from __future__ import annotations

import random

import pytest

from fastrl.engine.calibration import ScriptedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy
from tests.rl.grpo_setup import tiny_policy

ARMS = [Strategy.parse(a) for a in ("3_1_4", "2_2_4", "suffix_4", "3_1_4+suffix_4")]


@pytest.mark.parametrize("seed", range(4))
def test_a_rounds_context_is_the_tokens_its_rows_hold(seed):
    """Random arms, prompts, budgets and stops: each round's context is the prompts and outputs of the rows it ran
    over, counted before the round (requests finish and new ones join between rounds)."""
    rng = random.Random(seed)
    policy = tiny_policy(seed)
    script = ScriptedSelector([*ARMS, DISABLE])
    engine = Engine(policy, EngineConfig(max_batch_size=3), EagleDrafter(policy.config).eval(), script)
    for i in range(6):
        prompt = [rng.randrange(3, policy.config.vocab_size) for _ in range(rng.randint(1, 20))]
        params = SamplingParams(max_new_tokens=rng.randint(1, 30), temperature=rng.choice([0.0, 1.0]), seed=i)
        engine.add_request(prompt, params, request_id=str(i))
    held: dict[str, int] = {}  # tokens each running request holds
    while engine.has_unfinished():
        script.next = rng.choice([*ARMS, DISABLE])
        running = {r.request_id: r.num_tokens for r in engine.scheduler.running}
        before = len(engine.round_stats)
        outputs = engine.step()
        if len(engine.round_stats) > before:
            (stats,) = engine.round_stats[before:]
            ran = [i for i in running if i in held]  # rows prefilled in an earlier step
            assert stats.batch_size == len(ran) and stats.context_tokens == sum(running[i] for i in ran)
            assert stats.mean_context == pytest.approx(stats.context_tokens / stats.batch_size)
        held = {r.request_id: r.num_tokens for r in engine.scheduler.running}
        assert all(o.request_id not in held for o in outputs if o.finished)
    assert engine.round_stats and all(s.context_tokens > 0 for s in engine.round_stats)


def test_a_rounds_context_is_checked():
    def stats(context: object) -> RoundStats:
        return RoundStats(DISABLE, 2, [0, 0], [0, 0], [1, 1], 0.01, context_tokens=context)

    assert stats(0).mean_context is None and stats(30).mean_context == 15.0
    for bad in (-1, 1.5, "12", None, True):
        with pytest.raises(ValueError, match="context_tokens must be an integer >= 0"):
            stats(bad)
