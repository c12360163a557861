"""A selector without a cost model (a fixed strategy, the EMA tiers) gets its rounds' plain-decoding estimate from a
PlainTimeMeter: the bandit's round-time model over the same calibration, so the two estimate alike."""

from __future__ import annotations

import dataclasses
import random

import pytest

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.cost_model import CostModel
from fastrl.adaptive.plain_meter import PlainTimeMeter
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy

SIZES = (1, 8, 64)


def _calibration(arms: list[Strategy], rng: random.Random) -> CostModel:
    """Plain rounds of 10 ms at batch 1 growing with the batch, every arm 1.2-3x plain, a deeper chain dearer."""
    points = []
    for b in SIZES:
        plain = 0.01 * (1 + b / 16)
        points.append((DISABLE, b, plain))
        for arm in arms:
            points.append((arm, b, plain * (1.2 + 0.25 * arm.steps + rng.uniform(0.0, 0.2))))
    return CostModel.fit(points)


def _rounds(arm: Strategy, rng: random.Random, count: int, load: float, calibration: CostModel) -> list[RoundStats]:
    """Rounds of `arm` at random batch sizes that take `load` x their calibrated time (x noise); a stopping chain's
    rounds draft 1..steps levels."""
    out = []
    for _ in range(count):
        b = rng.randint(1, 40)
        depth = rng.randint(1, arm.steps) if arm.stops_early else arm.steps
        accepted = [rng.randint(0, depth) for _ in range(b)]
        seconds = calibration.round_time(arm, b) * load * rng.uniform(0.9, 1.1)
        out.append(RoundStats(arm, b, [depth] * b, accepted, [a + 1 for a in accepted], seconds))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_meter_estimates_what_a_one_arm_bandit_estimates(seed):
    rng = random.Random(seed)
    arm = rng.choice([Strategy.parse(s) for s in ("3_1_4", "5_1_6", "8_4_32", "12_1_13@0.3")])
    fixed = [Strategy.parse(s) for s in ("1_1_2", "2_1_3", "3_1_4", "5_1_6", "7_1_8")] if arm.stops_early else []
    calibration = _calibration([arm, *fixed], rng)
    meter = PlainTimeMeter(calibration, share=None)  # every round, as the bandit learns
    bandit = BanditSelector(BanditConfig(strategies=[str(arm)], decide_every_s=0.0))  # learns at every choice
    bandit.set_calibration(calibration)
    for stats in _rounds(arm, rng, 60, rng.uniform(0.5, 3.0), calibration):
        # the engine's order: choose, run, estimate from the rounds before, then observe
        bandit.choose(stats.batch_size)
        estimate = meter.plain_time_estimate(stats)
        assert estimate == bandit.plain_time_estimate(stats)
        assert estimate > 0.0
        bandit.observe(stats)
        meter.observe(stats)
    plain = RoundStats(DISABLE, 4, [0] * 4, [0] * 4, [1] * 4, 0.25)
    assert meter.plain_time_estimate(plain) == 0.25  # a plain round is its own estimate


@pytest.mark.parametrize("load", [0.4, 1.0, 2.5])
def test_the_estimate_follows_the_machines_load(load):
    """Rounds that all take `load` x their calibrated time: the plain round the meter predicts moves with them
    (within 15% after 200 rounds with +-10% noise), so the estimated speedup is the calibration's ratio, not the
    load's."""
    rng = random.Random(3)
    arm = Strategy.parse("5_1_6")
    calibration = _calibration([arm], rng)
    meter = PlainTimeMeter(calibration, share=None)
    for stats in _rounds(arm, rng, 200, load, calibration):
        meter.observe(stats)
    for b in (1, 8, 30):
        predicted = meter.times.plain_seconds(b)
        assert predicted == pytest.approx(load * calibration.round_time(DISABLE, b), rel=0.15)


def test_within_its_share_the_meter_learns_some_rounds_and_all_slow_ones():
    """Rounds of 1 ms: learning one (~50 us here; anything above 5 us) is more than 0.5% of the next few, which are
    skipped; rounds of 1 s are all learned."""
    rng = random.Random(5)
    arm = Strategy.parse("3_1_4")
    calibration = _calibration([arm], rng)
    fast = [dataclasses.replace(s, wall_time_s=0.001) for s in _rounds(arm, rng, 300, 1.0, calibration)]
    meter = PlainTimeMeter(calibration)
    for stats in fast:
        meter.observe(stats)
    assert 0 < meter.learned < len(fast) // 2
    every = PlainTimeMeter(calibration)
    for stats in fast[:20]:
        every.observe(dataclasses.replace(stats, wall_time_s=1.0))
    assert every.learned == 20
