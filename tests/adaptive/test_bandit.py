"""BEG bandit: exploration order, neighbour borrowing, bs_threshold, rewards, state round trip, telemetry."""

import json
import random

import pytest

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy

SPACE = ["8_4_32", "8_4_16", "8_4_8", "disable"]
BIG, MID, SMALL = Strategy(8, 4, 32), Strategy(8, 4, 16), Strategy(8, 4, 8)


def make_round(strategy: Strategy, batch: int, accepted: int, seconds: float) -> RoundStats:
    drafted = 0 if strategy.is_disabled else strategy.num_draft_tokens - 1
    accepted = 0 if strategy.is_disabled else accepted
    return RoundStats(strategy, batch, [drafted] * batch, [accepted] * batch, [accepted + 1] * batch, seconds)


def environment(strategy: Strategy, batch: int, rng: random.Random) -> RoundStats:
    """A small synthetic engine: bigger trees accept more but cost more, more so at larger batches."""
    if strategy.is_disabled:
        return make_round(strategy, batch, 0, 0.010 * (1 + rng.random() * 0.05))
    accepted = min(
        strategy.steps, strategy.num_draft_tokens - 1, int(rng.expovariate(1.0) * strategy.num_draft_tokens**0.5)
    )
    seconds = 0.012 + 0.0002 * strategy.num_draft_tokens * batch
    return make_round(strategy, batch, accepted, seconds * (1 + rng.random() * 0.05))


def run(policy: BanditSelector, batches: list[int], seed: int) -> list[Strategy]:
    rng = random.Random(seed)
    chosen = []
    for batch in batches:
        strategy = policy.choose(batch)
        policy.observe(environment(strategy, batch, rng))
        chosen.append(strategy)
    return chosen


def test_every_arm_is_tried_round_robin_before_exploiting():
    policy = BanditSelector(BanditConfig(strategies=SPACE, epsilon=0.5, seed=3))
    for batch in (1, 3, 12, 40):  # one fresh bucket after another
        first = []
        for _ in range(len(SPACE)):
            strategy = policy.choose(batch)
            first.append(str(strategy))
            policy.observe(make_round(strategy, batch, 0 if strategy == BIG else 4, 0.01))
        assert first == SPACE
    reasons = [c.reason for c in policy.telemetry().timeline]
    assert reasons == ["untried"] * 16
    assert policy.choose(1) in policy.strategies
    assert policy.telemetry().timeline[-1].reason in ("explore", "exploit")


def test_exploits_the_best_arm_after_trying_all():
    policy = BanditSelector(BanditConfig(strategies=SPACE, epsilon=0.0))
    for strategy in [BIG, MID, SMALL, DISABLE]:
        assert policy.choose(1) == strategy
        policy.observe(make_round(strategy, 1, {BIG: 5, MID: 2, SMALL: 1, DISABLE: 0}[strategy], 0.01))
    assert [policy.choose(1) for _ in range(5)] == [BIG] * 5  # 6 tokens / 10 ms beats the rest
    assert policy.telemetry().timeline[-1].reason == "exploit"


def test_bucket_arms_are_configurable():
    config = BanditConfig(strategies=SPACE, bucket_strategies={21: ["8_4_8", "disable"]}, epsilon=1.0)
    policy = BanditSelector(config)
    chosen = set()
    for _ in range(200):
        strategy = policy.choose(64)
        policy.observe(make_round(strategy, 64, 1, 0.01))
        chosen.add(strategy)
    assert chosen == {SMALL, DISABLE}
    assert set(policy.strategies) == {BIG, MID, SMALL, DISABLE}
    telemetry = policy.telemetry()
    assert [a.strategy for a in telemetry.buckets[3].arms] == [SMALL, DISABLE]
    assert len(telemetry.buckets[0].arms) == 4


def test_neighbour_borrowing():
    config = BanditConfig(strategies=SPACE, epsilon=0.0, explore_untried=False)
    policy = BanditSelector(config)
    for strategy, accepted in [(BIG, 1), (MID, 4), (SMALL, 2), (DISABLE, 0)]:
        for _ in range(3):
            policy.observe(make_round(strategy, 1, accepted, 0.01))  # bucket [1] only
    value, source = policy.estimate(1, MID, 3)
    assert source == 0
    assert value == pytest.approx(3 * 5 / 0.01)  # 3 requests * (4 + 1) tokens per 10 ms, borrowed outright
    assert policy.choose(3) == MID  # bucket [2-4] has no rounds yet, exploits the borrowed estimates
    assert policy.choose(40) == MID  # nearest bucket with data is two buckets away: still borrowed
    # with own rounds, the bucket's accept length is shrunk toward the neighbour's (16 rows of prior)
    policy.observe(make_round(MID, 2, 0, 0.01))
    value, source = policy.estimate(1, MID, 2)
    assert source == 0
    assert value == pytest.approx(2 * (2 * 1 + 16 * 5) / (2 + 16) / 0.01)
    unborrowed = BanditSelector(
        BanditConfig(strategies=SPACE, epsilon=0.0, explore_untried=False, borrow_neighbours=False)
    )
    unborrowed.observe(make_round(MID, 1, 4, 0.01))
    assert unborrowed.estimate(1, MID, 3) == (None, None)
    assert unborrowed.choose(3) == BIG  # no estimates anywhere in the bucket: the first arm


def test_estimates_compare_arms_at_the_current_batch_size():
    """Round time is looked up at the batch size at hand, not averaged over the window's batch sizes."""
    policy = BanditSelector(BanditConfig(strategies=["8_4_8", "disable"], epsilon=0.0))
    for batch in (64, 48, 32, 21):
        policy.observe(make_round(SMALL, batch, 2, 0.002 * batch))  # compute-bound: time grows with batch
        policy.observe(make_round(DISABLE, batch, 0, 0.02))
    assert policy.round_time(3, SMALL, 40) == pytest.approx(0.080)  # interpolated between 32 and 48
    assert policy.choose(64) == DISABLE  # 1 / 20 ms beats 3 / 128 ms per request
    assert policy.choose(21) == SMALL  # 3 / 42 ms beats 1 / 20 ms
    # below the measured batch sizes, the time scales like the reference arm's (flat here)
    assert policy.round_time(3, SMALL, 25) == pytest.approx(0.042 + (0.064 - 0.042) * 4 / 11)


def test_bs_threshold_disables_speculation_above_it():
    policy = BanditSelector(BanditConfig(strategies=["8_4_32", "8_4_8"], bs_threshold=8, epsilon=0.0))
    assert DISABLE in policy.strategies
    assert all(policy.choose(b) == DISABLE for b in (9, 16, 200))
    assert policy.choose(8) != DISABLE
    policy.observe(make_round(DISABLE, 32, 0, 0.01))
    policy.observe(make_round(BIG, 32, 3, 0.01))  # above the threshold: not learned from
    assert all(arm.pulls == 0 for bucket in policy.telemetry().buckets for arm in bucket.arms)
    assert policy.telemetry().timeline[0].reason == "bs_threshold"


def test_accept_length_reward_never_exploits_disable():
    """accept_length scores disable 1.0 (accepted 0 + 1), the least any arm can score: the bandit only picks
    disable to try or explore it, however slow speculation is."""
    policy = BanditSelector(BanditConfig(strategies=SPACE, reward="accept_length", epsilon=0.1, seed=5))
    batches = [64] * 300 + [3] * 300 + [1] * 300
    chosen = run(policy, batches, seed=5)
    timeline = policy.telemetry().timeline
    disabled = [c for c in timeline if c.strategy == DISABLE]
    assert disabled and all(c.reason in ("untried", "explore") for c in disabled)
    assert chosen.count(DISABLE) < 0.05 * len(chosen)
    assert policy.estimate(3, DISABLE, 64)[0] == 1.0
    assert all(arm.estimate >= 1.0 for bucket in policy.telemetry().buckets for arm in bucket.arms if arm.pulls)
    # the goodput reward does pick disable where speculation costs more than it gains (large batches)
    goodput = BanditSelector(BanditConfig(strategies=SPACE, epsilon=0.1, seed=5))
    chosen = run(goodput, [64] * 300, seed=5)
    assert chosen[-100:].count(DISABLE) > 80


def test_state_dict_round_trip_continues_identically():
    config = BanditConfig(strategies=SPACE, epsilon=0.2, window_size=8, seed=11)
    batches = [64 - i // 10 for i in range(400)] + [3] * 100 + [1] * 100
    policy = BanditSelector(config)
    run(policy, batches[:350], seed=1)
    state = json.loads(json.dumps(policy.state_dict()))  # survives JSON
    resumed = BanditSelector(BanditConfig(strategies=SPACE, epsilon=0.2, window_size=8, seed=11))
    resumed.load_state_dict(state)
    assert resumed.state_dict() == policy.state_dict()
    tail = batches[350:]
    continued = run(policy, tail, seed=2)
    assert run(resumed, tail, seed=2) == continued
    assert resumed.state_dict() == policy.state_dict()
    assert resumed.telemetry() == policy.telemetry()
    assert run(BanditSelector(config), tail, seed=2) != continued  # the saved state is what made them agree
    with pytest.raises(ValueError, match="different BanditConfig"):
        BanditSelector(BanditConfig(strategies=SPACE, epsilon=0.3)).load_state_dict(state)


def test_state_dict_round_trip_with_bucket_arms_through_json():
    config = BanditConfig(strategies=SPACE, bucket_strategies={21: ["8_4_8", "disable"], 1: ["8_4_32"]}, seed=4)
    policy = BanditSelector(config)
    run(policy, [40] * 30 + [1] * 5, seed=0)
    state = json.loads(json.dumps(policy.state_dict()))
    assert set(state["config"]["bucket_strategies"]) == {"21", "1"}
    resumed = BanditSelector(BanditConfig.from_dict(state["config"]))
    resumed.load_state_dict(state)
    assert resumed.config == config
    assert run(resumed, [30] * 20, seed=1) == run(policy, [30] * 20, seed=1)


def test_seed_makes_runs_reproducible_and_distinct():
    batches = [20] * 400
    a = run(BanditSelector(BanditConfig(strategies=SPACE, epsilon=0.3, seed=1)), batches, seed=0)
    b = run(BanditSelector(BanditConfig(strategies=SPACE, epsilon=0.3, seed=1)), batches, seed=0)
    c = run(BanditSelector(BanditConfig(strategies=SPACE, epsilon=0.3, seed=2)), batches, seed=0)
    assert a == b
    assert a != c


def test_telemetry():
    policy = BanditSelector(BanditConfig(strategies=SPACE, epsilon=0.1, window_size=4, timeline_limit=50))
    run(policy, [1] * 60 + [64] * 40, seed=0)
    telemetry = policy.telemetry()
    assert [b.label for b in telemetry.buckets] == ["1", "2-4", "5-20", "21+"]
    assert [b.rounds for b in telemetry.buckets] == [60, 0, 0, 40]
    assert sum(a.pulls for a in telemetry.buckets[0].arms) == 60
    for arm in telemetry.buckets[0].arms:
        assert arm.pulls >= 1
        assert arm.window_mean is not None and arm.all_time_mean is not None and arm.estimate is not None
    assert all(a.pulls == 0 and a.window_mean is None for a in telemetry.buckets[1].arms)
    assert telemetry.buckets[1].arms[0].borrowed_from == 0  # nearest bucket with data
    assert len(telemetry.timeline) == 50  # bounded
    assert telemetry.timeline[-1].round == 99
    assert [c.batch_size for c in telemetry.timeline[-40:]] == [64] * 40
    assert {c.reason for c in telemetry.timeline} <= {"untried", "explore", "exploit"}
