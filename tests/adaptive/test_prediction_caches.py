"""The bandit's predictions are memoised between learned rounds (per-arm path tokens by z, calibrated round times by
batch size and context): whatever order rounds, context changes and queries come in, every answer equals what a
fresh estimator fed the same history answers."""

from __future__ import annotations

import random

import pytest

from fastrl.adaptive.cost_model import CostModel
from fastrl.adaptive.depth_acceptance import DepthAcceptance
from fastrl.adaptive.round_times import RoundTimes
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import Strategy

ARMS = [Strategy.parse(a) for a in ("12_1_13@0.3", "7_1_8", "3_1_4", "8_4_32", "suffix_8", "3_1_4+suffix_8")]
ARMS.append(Strategy.parse("disable"))
ZS = (0.0, 0.0, 1.28, 2.33)
SIZES = (1, 3, 8, 13, 16, 64)


def random_round(rng: random.Random) -> RoundStats:
    """A round of a random arm at a random batch size and context (a stopping chain stopping at a random depth)."""
    arm, batch = rng.choice(ARMS), rng.choice(SIZES)
    if arm.is_disabled:
        accepted, drafted = [0] * batch, 0
    else:
        drafted = rng.randint(1, arm.steps) if arm.stops_early else arm.max_tree_nodes - 1
        accepted = [rng.randint(0, min(drafted, arm.max_accept_length - 1)) for _ in range(batch)]
    seconds = 0.002 * (1 + rng.random()) * (1 if arm.is_disabled else 3)
    context = batch * rng.choice([12, 40, 90, 300, 700])
    emitted = [a + 1 for a in accepted]
    return RoundStats(arm, batch, [drafted] * batch, accepted, emitted, seconds, context_tokens=context)


def calibration() -> CostModel:
    points = []
    for arm in ARMS:
        if arm.stops_early:
            continue  # timed through its fixed chains' curve
        cost = 1.0 if arm.is_disabled else 2.0 + arm.max_tree_nodes / 8
        for b in (1, 8, 64):
            for context in (22, 470):
                points.append((arm, b, 0.001 * cost * (1 + b / 32) * (1 + context / 400), context))
    return CostModel.fit(points)


@pytest.mark.parametrize("seed", range(5))
def test_acceptance_answers_as_a_fresh_estimator(seed):
    rng = random.Random(seed)
    cached, history = DepthAcceptance(ARMS, 4.0, 512.0), []
    for _ in range(40):
        stats = random_round(rng)
        cached.observe(stats)
        history.append(stats)
        for _ in range(rng.randint(0, 4)):
            arm, z = rng.choice(ARMS[:-1]), rng.choice(ZS)
            fresh = DepthAcceptance(ARMS, 4.0, 512.0)
            for earlier in history:
                fresh.observe(earlier)
            assert cached.tokens_per_row(arm, z) == fresh.tokens_per_row(arm, z)
            assert cached.rows(arm) == fresh.rows(arm)


@pytest.mark.parametrize("seed", range(5))
def test_round_times_answer_as_a_fresh_model(seed):
    rng = random.Random(seed)
    model = calibration()
    cached, calls = RoundTimes(model), []
    for _ in range(40):
        stats = random_round(rng)
        call = rng.choice(["observe_round", "observe_round", "plain_estimate"])  # both move the context
        getattr(cached, call)(stats)
        calls.append((call, stats))
        for _ in range(rng.randint(0, 4)):
            arm, batch = rng.choice(ARMS), rng.choice((*SIZES, 5, 100))
            fresh = RoundTimes(model)
            for name, earlier in calls:
                getattr(fresh, name)(earlier)
            assert cached.calibrated(arm, batch) == fresh.calibrated(arm, batch)
            assert cached.seconds(arm, batch) == fresh.seconds(arm, batch)
            assert cached.has_calibration(arm) == fresh.has_calibration(arm) == (not arm.stops_early)


@pytest.mark.parametrize("seed", range(8))
def test_a_plain_time_estimate_that_moves_the_context_is_seen_by_the_next_decision(seed):
    """The engine asks every round for its plain-time estimate, which moves the round times' context, also for
    rounds the bandit does not learn (past bs_threshold, or not of an arm); the bandit's memo of its predictions was
    cleared only by learned rounds, so the next choice mixed goodputs of the old context with costs of the new one.
    Its choices now equal those of the same bandit with its memo emptied."""
    import copy

    from fastrl.adaptive.bandit import BanditSelector
    from fastrl.adaptive.bandit_config import BanditConfig

    arms = ["5_1_6", "3_1_4", "8_4_32", "disable"]
    config = BanditConfig(strategies=arms, bs_threshold=16, decide_every_s=0.0)
    selector = BanditSelector(config, calibration=calibration())
    rng = random.Random(seed)
    for _ in range(60):
        batch = rng.choice([1, 2, 4, 8, 16])
        arm = selector.choose(batch)
        accepted = [0 if arm.is_disabled else rng.randint(0, arm.max_accept_length - 1) for _ in range(batch)]
        drafted = [0 if arm.is_disabled else arm.max_tree_nodes - 1] * batch
        stats = RoundStats(arm, batch, drafted, accepted, [a + 1 for a in accepted], 0.004 * (1 + rng.random()),
                           context_tokens=30 * batch)  # fmt: skip
        selector.plain_time_estimate(stats)
        selector.observe(stats)
    selector.choose(batch)  # learns what is queued: predictions memoised at a short context
    unlearned = RoundStats(Strategy.parse("disable"), 64, [0] * 64, [0] * 64, [1] * 64, 0.05, context_tokens=4000 * 64)
    selector.plain_time_estimate(unlearned)
    selector.observe(unlearned)
    fresh = copy.deepcopy(selector)
    fresh._memo.clear()
    for size in (1, 2, 4, 8, 16):
        assert (selector.choose(size), selector.last_reason) == (fresh.choose(size), fresh.last_reason)
