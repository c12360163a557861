"""Round times as a Kalman filter over one shared load and per-arm biases, plain's held tightest (``RoundTimes``,
``LogTimeFilter``): what the fixed-rate split got wrong, the covariance at work, state and merge, and a seeded sweep
of machines whose calibration is off per arm."""

import math
import random

import pytest

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.bandit_merge import merge_bandit_states
from fastrl.adaptive.cost_model import CostModel
from fastrl.adaptive.round_times import RoundTimes
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy

CHAIN, LONG = Strategy.parse("3_1_4"), Strategy.parse("7_1_8")
SIZES = (1, 8, 64)


def plain_s(b: int) -> float:
    return 0.004 + 0.0002 * b


def chain_s(b: int) -> float:
    return 0.007 + 0.0007 * b


def long_s(b: int) -> float:
    return 0.010 + 0.0012 * b


def calibration() -> CostModel:
    cost = {DISABLE: plain_s, CHAIN: chain_s, LONG: long_s}
    return CostModel.fit([(arm, b, f(b)) for arm, f in cost.items() for b in SIZES])


def ratio(times: RoundTimes, arm: Strategy, b: int) -> float:
    return times.seconds(arm, b) / times.seconds(DISABLE, b)


def test_a_slow_first_round_does_not_bend_the_ratio_between_arms():
    """The engine's first plain round ran 2x slow, the rest as calibrated: the load comes back to the calibration
    and an arm never run keeps its calibrated ratio to plain within 1% (0.2% measured; the fixed-rate split left
    the load 13% high and plain's bias as much below, so 3_1_4 looked 3.6x a plain round where the calibration said
    2.9x: 24% off)."""
    times = RoundTimes(calibration())
    times.observe(DISABLE, 64, 2 * plain_s(64))
    for _ in range(30):
        times.observe(DISABLE, 64, plain_s(64))
    assert times.plain_seconds(64) == pytest.approx(plain_s(64), rel=0.03)
    assert ratio(times, CHAIN, 64) == pytest.approx(chain_s(64) / plain_s(64), rel=0.01)


def test_plain_rounds_after_a_stretch_of_one_arm_correct_its_bias_too():
    """3_1_4 really costs 0.8x its calibration. A stretch of it alone cannot tell a lighter machine from a cheaper
    arm (it predicts its own rounds right, and plain's 10% low or more); the plain anchors that follow pin plain's
    time and, through the covariance the stretch left, 3_1_4's bias. An arm that did not run shares the load, which
    the stretch moved part of the way: 6% measured (the fixed-rate split: 15%)."""
    times = RoundTimes(calibration())
    for _ in range(40):
        times.observe(CHAIN, 64, 0.8 * chain_s(64))
    assert times.seconds(CHAIN, 64) == pytest.approx(0.8 * chain_s(64), rel=0.03)
    assert times.plain_seconds(64) < 0.9 * plain_s(64)
    for _ in range(10):
        times.observe(DISABLE, 64, plain_s(64))
        for _ in range(4):
            times.observe(CHAIN, 64, 0.8 * chain_s(64))
    assert times.plain_seconds(64) == pytest.approx(plain_s(64), rel=0.03)
    assert times.seconds(CHAIN, 64) == pytest.approx(0.8 * chain_s(64), rel=0.03)
    assert ratio(times, LONG, 64) == pytest.approx(long_s(64) / plain_s(64), rel=0.08)


def test_an_uncalibrated_arm_is_timed_by_its_rounds():
    times = RoundTimes(calibration())
    other = Strategy.parse("5_1_6")
    assert times.seconds(other, 4) is None
    for _ in range(20):
        times.observe(other, 4, 0.020)
    assert times.seconds(other, 4) == pytest.approx(0.020, rel=0.05)
    assert RoundTimes().seconds(CHAIN, 8) is None


def test_state_round_trip_and_a_new_arm_set():
    times = RoundTimes(calibration())
    extra = Strategy.parse("5_1_6")
    rng = random.Random(0)
    for _ in range(50):
        arm = rng.choice([DISABLE, CHAIN, LONG, extra])
        b = rng.choice([1, 5, 30, 64])
        times.observe(arm, b, 0.01 * math.exp(rng.gauss(0, 0.2)))
    restored = RoundTimes(calibration())
    restored.load_state(times.state())
    for arm in (DISABLE, CHAIN, LONG, extra):
        for b in (1, 3, 20, 64, 100):
            assert restored.seconds(arm, b) == pytest.approx(times.seconds(arm, b), rel=1e-12)
    narrower = RoundTimes(CostModel.fit([(DISABLE, b, plain_s(b)) for b in SIZES]))  # the chains uncalibrated now
    narrower.load_state(times.state())
    assert narrower.plain_seconds(64) == pytest.approx(times.plain_seconds(64), rel=1e-12)
    assert narrower.seconds(CHAIN, 64) is None  # its bias was against a calibration this model does not have
    assert narrower.seconds(extra, 30) == pytest.approx(times.seconds(extra, 30), rel=1e-12)


def test_merged_times_lie_between_the_workers():
    def worker(scale: float) -> BanditSelector:
        selector = BanditSelector(BanditConfig(strategies=["3_1_4", "7_1_8", "disable"]), calibration=calibration())
        for _ in range(20):
            for arm, f in ((CHAIN, chain_s), (DISABLE, plain_s)):
                selector.observe(RoundStats(arm, 8, [0] * 8, [0] * 8, [1] * 8, scale * f(8)))
        return selector

    a, b = worker(1.0), worker(1.5)
    merged = BanditSelector(BanditConfig(strategies=["3_1_4", "7_1_8", "disable"]))
    merged.load_state_dict(merge_bandit_states([a.state_dict(), b.state_dict()]))
    for arm in (CHAIN, DISABLE):
        low, high = a.times.seconds(arm, 8), b.times.seconds(arm, 8)
        assert low < merged.times.seconds(arm, 8) < high


@pytest.mark.parametrize("seed", range(8))
def test_ratios_and_plain_time_are_learned_under_a_wandering_load(seed):
    """A machine whose load wanders (a random walk of 5% a round, within 0.6x-1.8x), a calibration off by up to 25%
    per arm, rounds with 5% noise, arms and batch sizes at random (plain a fifth of the rounds): every arm's time
    relative to plain's comes within 6% of the truth at every size it ran, and plain's time predicted before each
    round, summed over the run (the speedup estimate's reference), within 3% of the truth."""
    rng = random.Random(seed)
    truth = {DISABLE: 1.0, CHAIN: math.exp(rng.uniform(-0.25, 0.25)), LONG: math.exp(rng.uniform(-0.25, 0.25))}
    cost = {DISABLE: plain_s, CHAIN: chain_s, LONG: long_s}
    times = RoundTimes(calibration())
    load, estimated, real = 0.0, 0.0, 0.0
    for _ in range(600):
        load = max(-0.5, min(0.6, load + rng.gauss(0, 0.05)))
        arm = DISABLE if rng.random() < 0.2 else rng.choice([CHAIN, LONG])
        b = rng.choice([4, 16, 40])
        estimated += times.plain_seconds(b)
        real += plain_s(b) * math.exp(load)
        times.observe(arm, b, cost[arm](b) * truth[arm] * math.exp(load + rng.gauss(0, 0.05)))
    for arm in (CHAIN, LONG):
        for b in (4, 16, 40):
            assert ratio(times, arm, b) == pytest.approx(truth[arm] * cost[arm](b) / plain_s(b), rel=0.06), (arm, b)
    assert estimated == pytest.approx(real, rel=0.03)


def test_a_variance_wider_than_any_residual_is_refused():
    """cov[0][0] = 1e30 used to pass, and the next round's update lost the variance to rounding: a math domain
    error in the middle of decoding."""
    from fastrl.adaptive.time_filter import MAX_LOG_RESIDUAL, checked_state

    times = RoundTimes()
    state = times.state()["filter"]
    for variance in (1e30, MAX_LOG_RESIDUAL**2 * 1.01):
        with pytest.raises(ValueError, match=r"times\.filter\.cov\[0\]\[0\] is .*: a variance must be <= 10000"):
            checked_state(state | {"cov": [[variance]]})
    checked_state(state | {"cov": [[MAX_LOG_RESIDUAL**2]]})
