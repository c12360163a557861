"""An exploratory pull pays its draft sources' catch-up on the text emitted without them: the bandit learns what
that costs per backlog token and charges it to exploration (on task prompts x 8 at batch 64 the catch-ups of the
first pulls after plain rounds were most of the bandit's loss to plain decoding)."""

from __future__ import annotations

import random

import pytest

from fastrl.adaptive import bandit as bandit_module
from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.bandit_merge import merge_bandit_states
from fastrl.adaptive.catch_up import CatchUpCosts, sources
from fastrl.adaptive.cost_model import CostModel
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy

CHAIN, SUFFIX, HYBRID = Strategy.parse("3_1_4"), Strategy.parse("suffix_8"), Strategy.parse("3_1_4+suffix_8")


def stats(
    arm: Strategy, rows: int, emitted: int, seconds: float, catch_up: float = 0.0, context: int = 0
) -> RoundStats:
    drafted = 0 if arm.is_disabled else 3
    accepted = 0 if arm.is_disabled else emitted - 1
    counts = [drafted] * rows, [accepted] * rows, [emitted] * rows
    return RoundStats(arm, rows, *counts, seconds, catch_up_time_s=catch_up, context_tokens=context)


def test_each_source_keeps_its_backlog_and_learns_its_rate_from_its_own_rounds():
    costs = CatchUpCosts()
    assert sources(HYBRID) == ("drafter", "history") and sources(DISABLE) == ()
    costs.observe(stats(DISABLE, 10, 1, 0.01))
    costs.observe(stats(DISABLE, 10, 1, 0.01))
    assert costs.backlog == {"drafter": 20, "history": 20} and costs.seconds(CHAIN) == 0.0  # no rate yet
    costs.observe(stats(CHAIN, 10, 3, 0.05, catch_up=0.004))  # caught up on 20 tokens
    assert costs.rate("drafter") == pytest.approx(0.0002) and costs.backlog == {"drafter": 0, "history": 50}
    costs.observe(stats(HYBRID, 10, 2, 0.6, catch_up=0.5))  # one number for both sources: no rate learned
    assert costs.rate("history") == 0.0 and costs.rate("drafter") == pytest.approx(0.0002)
    assert costs.backlog == {"drafter": 0, "history": 0}
    for _ in range(5):
        costs.observe(stats(DISABLE, 10, 1, 0.01))
    costs.observe(stats(SUFFIX, 10, 2, 0.02, catch_up=0.001))  # caught up on 50
    assert costs.rate("history") == pytest.approx(0.00002)
    assert costs.seconds(CHAIN) == pytest.approx(0.0002 * 70) and costs.seconds(SUFFIX) == 0.0
    assert costs.seconds(HYBRID) == pytest.approx(0.0002 * 70)
    again = CatchUpCosts()
    again.load(costs.state())
    assert again.state() == costs.state()
    costs.observe(stats(DISABLE, 10, 1, 0.01, context=35))  # rows of 3-4 tokens: no more to catch up on
    assert costs.backlog == {"drafter": 45, "history": 10}
    fresh = CatchUpCosts()
    fresh.load(costs.state(), backlog=False)
    assert fresh.backlog == {"drafter": 0, "history": 0} and fresh.rate("drafter") == costs.rate("drafter")


def near_tie() -> CostModel:
    """Batch 64: a plain round 10 ms; a 3_1_4 round 20 ms, nearly as good as plain at two tokens a row."""
    return CostModel.fit([(DISABLE, b, 0.010) for b in (1, 64)] + [(CHAIN, b, 0.020) for b in (1, 64)])


ROWS_HOLD = 64 * 100
"""Tokens the rows of ``decode`` hold (requests retire: no backlog is longer)."""


def decode(selector: BanditSelector, rounds: int, seed: int, rate: float) -> tuple[float, int]:
    """An engine at batch 64 whose drafter rounds first catch up on the backlog at ``rate`` seconds a token: the
    goodput of its rounds (tokens a second) and the drafter rounds pulled."""
    rng, backlog, total, tokens, pulls = random.Random(seed), 0, 0.0, 0, 0
    for _ in range(rounds):
        arm = selector.choose(64)
        if arm.is_disabled:
            stat = stats(DISABLE, 64, 1, 0.010 * rng.uniform(0.98, 1.02), context=ROWS_HOLD)
            backlog = min(backlog + 64, ROWS_HOLD)
        else:
            pulls += 1
            catch_up = rate * backlog
            emitted = rng.choice([1, 2, 2, 3])  # two tokens a row on average: a near tie with plain
            stat = stats(CHAIN, 64, emitted, 0.020 * rng.uniform(0.98, 1.02) + catch_up, catch_up, ROWS_HOLD)
            backlog = 0
        total += stat.wall_time_s
        tokens += stat.total_emitted
        selector.observe(stat)
    return tokens / total, pulls


@pytest.mark.parametrize("seed", range(4))
def test_pulls_after_plain_rounds_are_charged_their_catch_up(seed, monkeypatch):
    """Catch-ups of 0.1 ms a token (64 rows x 10 plain rounds: 64 ms, six plain rounds): the bandit that charges
    them pulls the drafter less after plain rounds and decodes >10% faster than the same bandit that does not (at
    0.75-0.78x plain decoding, a near tie at best: 6,400 tokens a second, its credit spent on catch-ups it never
    counted), within its exploration budget and the first catch-up it could not foresee of plain (0.92-0.96x)."""
    config = BanditConfig(strategies=["3_1_4", "disable"], prior_rows=64, seed=seed)
    charged = decode(BanditSelector(config, near_tie()), 1500, seed, rate=1e-4)
    monkeypatch.setattr(bandit_module.CatchUpCosts, "seconds", lambda self, arm: 0.0)
    blind = decode(BanditSelector(config, near_tie()), 1500, seed, rate=1e-4)
    assert charged[1] < blind[1] and charged[0] > 1.1 * blind[0] and charged[0] >= 0.9 * 6400, (charged, blind)


def test_the_catch_up_rates_are_saved_resumed_carried_and_merged():
    selector = BanditSelector(BanditConfig(strategies=["3_1_4", "disable"]), near_tie())
    selector.observe(stats(DISABLE, 8, 1, 0.01))
    selector.observe(stats(CHAIN, 8, 2, 0.03, catch_up=0.0016))  # 0.2 ms a token
    selector.observe(stats(DISABLE, 8, 1, 0.01))
    state = selector.state_dict()
    assert state["catch_up"]["drafter"] == [8, 0.0016, 8]
    resumed = BanditSelector(BanditConfig(strategies=["3_1_4", "disable"]))
    resumed.load_state_dict(state)
    assert resumed.state_dict()["catch_up"] == state["catch_up"]
    carried = BanditSelector(BanditConfig(strategies=["3_1_4", "disable"]))
    carried.warm_start(state)  # another run: the rate, not the backlog
    assert carried.state_dict()["catch_up"]["drafter"] == [0, 0.0016, 8]
    merged = merge_bandit_states([state, carried.state_dict()])
    assert merged["catch_up"]["drafter"] == [0, 0.0032, 16]
    old = {k: v for k, v in state.items() if k != "catch_up"}  # saved before catch-ups were charged
    BanditSelector(BanditConfig(strategies=["3_1_4", "disable"])).load_state_dict(old)
    assert "catch_up" not in merge_bandit_states([old, state])
    for bad, said in (
        ({"drafter": [0, 0.0, 0]}, "must hold"),
        ({"drafter": [0, 0.0, 0], "history": [1, 2.0]}, r"catch_up.history must be"),
        ({"drafter": [-1, 0.0, 0], "history": [0, 0.0, 0]}, "integers >= 0"),
        ({"drafter": [0, float("nan"), 0], "history": [0, 0.0, 0]}, "finite number"),
    ):
        with pytest.raises(ValueError, match=said):
            BanditSelector(BanditConfig(strategies=["3_1_4", "disable"])).load_state_dict(state | {"catch_up": bad})
