"""The bandit's exploration credit pays for the tokens exploratory rounds really emitted, not the tokens predicted:
on an engine whose speculative rounds are slower than the calibration says and accept less than the family prior,
the loss of every exploratory round (its predicted time less the time the best arm's predicted goodput needs for the
tokens it emitted) is taken from the credit, so exploration stays within ``explore_budget`` of the run's time."""

import random

import pytest

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.cost_model import CostModel
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import Strategy

ARMS = ["7_1_8", "5_1_6", "3_1_4", "suffix_8", "disable"]


def calibrated_like_plain() -> CostModel:
    """A calibration that says every arm costs what a plain round does (10 ms at batch 1, 40 ms at 8)."""
    return CostModel.fit([(Strategy.parse(a), b, 0.010 * (1 + 3 * (b > 1))) for a in ARMS for b in (1, 8)])


def slow_round(strategy: Strategy, batch: int, rng: random.Random, slowdown: float, hit: float) -> RoundStats:
    """A round of the engine under test: speculation costs ``slowdown`` x plain and each depth hits with ``hit``."""
    accepted = []
    for _ in range(batch):
        a = 0
        while not strategy.is_disabled and a < strategy.steps and rng.random() < hit:
            a += 1
        accepted.append(a)
    drafted = 0 if strategy.is_disabled else strategy.max_tree_nodes - 1
    plain = 0.010 * (1 + 3 * (batch > 1))
    seconds = plain * (1.0 if strategy.is_disabled else slowdown) * (1 + 0.1 * rng.random())
    return RoundStats(strategy, batch, [drafted] * batch, accepted, [a + 1 for a in accepted], seconds)


@pytest.mark.parametrize("seed", range(6))
def test_every_exploratory_round_pays_its_measured_loss_and_the_total_stays_in_budget(seed: int) -> None:
    rng = random.Random(seed)
    slowdown, hit, budget = rng.uniform(1.2, 1.8), rng.uniform(0.05, 0.3), rng.choice([0.05, 0.1, 0.2])
    bandit = BanditSelector(BanditConfig(strategies=ARMS, explore_budget=budget), calibrated_like_plain())
    total, lost, worst = 0.0, 0.0, 0.0
    for _ in range(400):
        batch = rng.choice([1, 1, 2, 3, 8])
        credit_before = bandit.state_dict()["explore_credit"]
        strategy = bandit.choose(batch)
        reason = bandit.telemetry().timeline[-1].reason
        best, seconds = bandit.state_dict()["explore_best"], bandit.state_dict()["explore_seconds"]
        stats = slow_round(strategy, batch, rng, slowdown, hit)
        bandit.observe(stats)
        loss = 0.0
        if reason in ("explore", "anchor"):
            assert best is not None and best > 0.0
            loss = max(0.0, seconds - stats.total_emitted / best)
        else:
            assert best is None
        assert bandit.state_dict()["explore_credit"] == pytest.approx(
            credit_before + budget * stats.wall_time_s - loss, abs=1e-12
        )
        total, lost, worst = total + stats.wall_time_s, lost + loss, max(worst, loss)
    # A pull is allowed while its predicted cost fits the credit; its loss may overdraw it once.
    assert lost <= budget * total + worst + 1e-12


def test_the_pending_exploration_survives_a_state_round_trip() -> None:
    config = BanditConfig(strategies=ARMS, explore_budget=0.2)
    bandit = BanditSelector(config, calibrated_like_plain())
    rng = random.Random(0)
    for _ in range(400):  # an exploit decision holds up to decide_every rounds: exploration waits for a decision
        strategy = bandit.choose(1)
        if bandit.state_dict()["explore_best"] is not None:
            break
        bandit.observe(slow_round(strategy, 1, rng, 1.5, 0.2))
    state = bandit.state_dict()
    assert state["explore_best"] is not None, "no exploratory round in 400"
    restored = BanditSelector(config, calibrated_like_plain())
    restored.load_state_dict(state)
    stats = slow_round(strategy, 1, random.Random(1), 1.5, 0.2)
    bandit.observe(stats)
    restored.observe(stats)
    assert restored.state_dict() == bandit.state_dict()
