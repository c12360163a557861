"""The predictive bandit: shared per-depth acceptance, calibrated round times, exploration only near the best,
bs_threshold, rewards, the plain-time estimate, state round trip and warm start, telemetry."""

import json
import random

import pytest

from fastrl.adaptive.bandit import RESUMED_KEYS, RESUMED_NULLABLE_KEYS, BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.cost_model import CostModel
from fastrl.adaptive.depth_acceptance import DepthAcceptance, contains
from fastrl.adaptive.round_times import RoundTimes, knee_curve
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy

SPACE = ["8_4_32", "8_4_16", "8_4_8", "disable"]
BIG, MID, SMALL = Strategy(8, 4, 32), Strategy(8, 4, 16), Strategy(8, 4, 8)
CHAINS = ["7_1_8", "5_1_6", "3_1_4", "disable"]


def make_round(strategy: Strategy, accepted: list[int], seconds: float) -> RoundStats:
    drafted = 0 if strategy.is_disabled else strategy.max_tree_nodes - 1
    accepted = [0 if strategy.is_disabled else a for a in accepted]
    batch = len(accepted)
    return RoundStats(strategy, batch, [drafted] * batch, accepted, [a + 1 for a in accepted], seconds)


def seconds_of(strategy: Strategy, batch: int) -> float:
    """A synthetic engine: a plain round 10 ms flat; a tree round 12 ms + 0.2 ms per verified token."""
    if strategy.is_disabled:
        return 0.010
    return 0.012 + 0.0002 * strategy.num_draft_tokens * batch


def hit_probability(strategy: Strategy) -> float:
    return 0.5 + 0.4 * min(strategy.num_draft_tokens, 32) / 32  # larger trees agree more often per depth


def environment(strategy: Strategy, batch: int, rng: random.Random) -> RoundStats:
    accepted = []
    for _ in range(batch):
        a = 0
        depth = min(strategy.steps, strategy.max_tree_nodes - 1)
        while not strategy.is_disabled and a < depth and rng.random() < hit_probability(strategy):
            a += 1
        accepted.append(a)
    return make_round(strategy, accepted, seconds_of(strategy, batch) * (1 + rng.random() * 0.05))


def calibration(arms: list[str], sizes=(1, 8, 64)) -> CostModel:
    return CostModel.fit([(Strategy.parse(a), b, seconds_of(Strategy.parse(a), b)) for a in arms for b in sizes])


def run(policy: BanditSelector, batches: list[int], seed: int) -> list[Strategy]:
    rng = random.Random(seed)
    chosen = []
    for batch in batches:
        strategy = policy.choose(batch)
        policy.observe(environment(strategy, batch, rng))
        chosen.append(strategy)
    return chosen


@pytest.mark.parametrize("limit", [0, 10, 10**6])
def test_a_state_loads_under_another_timeline_limit_and_continues_identically(limit):
    """timeline_limit (changeable on a train resume) keeps telemetry only: a state saved under another one loads, with
    the most recent ``limit`` choices of its timeline, and the bandit decides as the one that saved it."""
    policy = BanditSelector(BanditConfig(strategies=SPACE, timeline_limit=100), calibration=calibration(SPACE))
    run(policy, [8] * 60 + [1] * 60, seed=1)
    state = json.loads(json.dumps(policy.state_dict()))
    resumed = BanditSelector(BanditConfig(strategies=SPACE, timeline_limit=limit))
    resumed.load_state_dict(state)
    saved = policy.telemetry().timeline
    assert len(saved) == 100 and resumed.telemetry().timeline == saved[max(len(saved) - limit, 0) :]
    assert run(resumed, [3] * 80, seed=2) == run(policy, [3] * 80, seed=2)
    assert len(resumed.telemetry().timeline) == min(limit, 180)  # its own limit from then on


def test_what_train_lets_change_on_resume_loads():
    """Every strategy.bandit key fastrl train lets change on resume is one a bandit state loads under; the EMA
    controller's state depends on every key of its config."""
    from fastrl.adaptive.bandit_config import CHANGEABLE_ON_LOAD
    from fastrl.commands.train_setup import CHANGEABLE_ON_RESUME

    bandit = {
        key.removeprefix("strategy.bandit.") for key in CHANGEABLE_ON_RESUME if key.startswith("strategy.bandit.")
    }
    assert bandit and bandit <= set(CHANGEABLE_ON_LOAD)
    assert not [key for key in CHANGEABLE_ON_RESUME if key.startswith("strategy.ema.")]


def test_acceptance_is_shared_by_arms_that_contain_each_other():
    chains = [Strategy.parse(s) for s in CHAINS]
    acceptance = DepthAcceptance(chains, prior_rows=4.0, memory_rows=1e9)
    long_chain, short_chain = chains[0], chains[2]
    assert contains(long_chain, short_chain) and not contains(short_chain, long_chain)
    assert not contains(Strategy.parse("suffix_8"), short_chain)
    untaught = acceptance.tokens_per_row(short_chain)
    for _ in range(50):  # only the 7-deep chain runs: every row accepts 2 then misses
        acceptance.observe(make_round(long_chain, [2] * 8, 0.01))
    assert acceptance.tokens_per_row(long_chain) == pytest.approx(3.0, abs=0.1)
    taught = acceptance.tokens_per_row(short_chain)  # never pulled, predicted from the chain that holds its own
    assert abs(taught - 3.0) < 0.4 < abs(untaught - 3.0)  # a prior worth prior_rows rows, not the truth yet
    assert acceptance.tokens_per_row(DISABLE) == 1.0
    assert acceptance.tokens_per_row(short_chain, z=2.0) > taught  # optimism grows with z


def test_a_larger_tree_is_predicted_no_worse_than_one_it_contains():
    acceptance = DepthAcceptance([BIG, MID, SMALL], prior_rows=4.0, memory_rows=1e9)
    for _ in range(20):
        acceptance.observe(make_round(SMALL, [4] * 16, 0.01))
    assert acceptance.tokens_per_row(BIG) >= acceptance.tokens_per_row(SMALL) == pytest.approx(5.0, abs=0.2)


def test_knee_curve_is_flat_then_linear():
    points = [(1, 10.0), (8, 10.0), (64, 66.0)]  # flat to 8, then 1.0 per row
    assert knee_curve(points, 1) == knee_curve(points, 0) == 10.0
    assert knee_curve(points, 16) == pytest.approx(18.0)  # on the chord of the last segment
    assert knee_curve(points, 128) == pytest.approx(130.0)
    knee = [(1, 10.0), (8, 10.0), (16, 10.0), (64, 58.0)]
    assert knee_curve(knee, 4) == 10.0
    assert knee_curve([(1, 10.0), (8, 17.0), (64, 73.0)], 4) == pytest.approx(13.0)  # the chord caps it


def test_round_times_follow_measured_rounds():
    times = RoundTimes(calibration(["3_1_4", "disable"]))
    arm = Strategy.parse("3_1_4")
    calibrated = times.seconds(arm, 8)
    for _ in range(40):
        times.observe(arm, 8, 2 * calibrated)  # real rounds run twice as slow as calibrated
    assert times.seconds(arm, 8) == pytest.approx(2 * calibrated, rel=0.05)
    assert times.seconds(arm, 64) > 1.5 * times.calibrated(arm, 64)  # the ratio carries to other sizes
    assert times.plain_seconds(8) > times.calibrated(DISABLE, 8)  # and to arms not run (all arms' ratio)
    assert RoundTimes().seconds(arm, 8) is None
    times.observe(arm, 8, 1000.0)  # one stalled round moves the estimate by at most exp(MAX_STEP)
    assert times.seconds(arm, 8) < 1.5 * 2 * calibrated


@pytest.mark.parametrize("arm", ["suffix_8", "3_1_4", "3_1_4+suffix_8"])
def test_a_rounds_catch_up_is_not_learned_as_the_arms_cost(arm):
    """Two bandits see the same rounds of an arm, each after a plain round, one of them with half of each round
    spent catching up on earlier text (`catch_up_time_s`: the history index's, or the drafter's after rounds without
    it): both learn the same round time, and learn it (a drafter arm pulled among plain rounds is timed too)."""
    arms, strategy = [arm, "disable"], Strategy.parse(arm)
    learned = []
    for catch_up in (0.0, 0.01):
        bandit = BanditSelector(BanditConfig(strategies=arms, decide_every_s=0.0), calibration(arms))
        before = bandit.times.seconds(strategy, 4)
        for _ in range(12):
            bandit.observe(RoundStats(DISABLE, 4, [0] * 4, [0] * 4, [1] * 4, 0.004))
            bandit.observe(RoundStats(strategy, 4, [3] * 4, [2] * 4, [3] * 4, 0.03 + catch_up, 0, 0, 0, catch_up))
        learned.append(bandit.times.seconds(strategy, 4) / bandit.times.plain_seconds(4))
    assert learned[0] == pytest.approx(learned[1], rel=1e-9)
    assert learned[0] > 1.5 * before / calibration(arms).round_time(DISABLE, 4)  # 7.5x plain, calibrated 1.2-1.5x
    with pytest.raises(ValueError, match="catch_up_time_s"):
        RoundStats(DISABLE, 1, [0], [0], [1], 0.01, catch_up_time_s=0.01)


def test_picks_the_best_arm_per_batch_size_from_calibration_and_shared_acceptance():
    policy = BanditSelector(BanditConfig(strategies=SPACE), calibration=calibration(SPACE))
    chosen = run(policy, [1] * 300 + [64] * 300, seed=0)
    # batch 1: verification is nearly free, the largest tree wins; batch 64: a 32-token tree costs 42 plain rounds
    assert chosen[200:300].count(BIG) > 90
    assert chosen[-100:].count(DISABLE) > 95
    assert BIG not in chosen[300:]  # clearly losing at batch 64 even if every draft were accepted: never pulled
    reasons = [c.reason for c in policy.telemetry().timeline]
    assert "untimed" not in reasons


def test_without_calibration_arms_are_timed_first():
    policy = BanditSelector(BanditConfig(strategies=SPACE, min_pulls=2))
    chosen = run(policy, [4] * 20, seed=0)
    assert sorted(map(str, chosen[:8])) == sorted(SPACE * 2)
    assert [c.reason for c in policy.telemetry().timeline[:8]] == ["untimed"] * 8


def test_a_warm_start_that_brings_every_arms_times_forces_no_untimed_pulls():
    """Without a calibration, a bandit warm-started from a run that timed every arm pulled each min_pulls times
    again as "untimed" (deep trees at a large batch among them), though it predicted all their times; a resumed
    run forces what the saved run had still to force, no more and no less."""
    config = BanditConfig(strategies=SPACE, min_pulls=2, calibrate=False)
    first = BanditSelector(config)
    run(first, [4] * 40, seed=0)
    state = json.loads(json.dumps(first.state_dict()))
    warm = BanditSelector(config)
    warm.warm_start(state)
    run(warm, [40] * 20, seed=1)
    assert "untimed" not in [c.reason for c in warm.telemetry().timeline]
    early = BanditSelector(config)
    run(early, [4] * 3, seed=0)  # 3 of the 8 forced pulls made
    resumed = BanditSelector(config)
    resumed.load_state_dict(json.loads(json.dumps(early.state_dict())))
    assert run(resumed, [4] * 10, seed=5) == run(early, [4] * 10, seed=5)
    assert [c.reason for c in resumed.telemetry().timeline] == [c.reason for c in early.telemetry().timeline]


def test_no_exploration_with_epsilon_zero():
    policy = BanditSelector(BanditConfig(strategies=SPACE, epsilon=0.0), calibration=calibration(SPACE))
    run(policy, [1] * 100, seed=0)
    assert {c.reason for c in policy.telemetry().timeline} == {"exploit", "held"}


def test_bucket_arms_are_configurable():
    config = BanditConfig(strategies=SPACE, bucket_strategies={1: ["8_4_8"], 21: ["8_4_32", "disable"]})
    policy = BanditSelector(config, calibration=calibration(SPACE))
    chosen = run(policy, [1] * 20 + [30] * 40, seed=0)
    assert set(chosen[:20]) == {SMALL}
    assert set(chosen[20:]) <= {BIG, DISABLE}
    with pytest.raises(ValueError, match=r"bucket_strategies\[5\]"):
        BanditConfig(strategies=SPACE, bucket_strategies={5: ["3_1_4"]})


def test_bs_threshold_disables_speculation_above_it():
    policy = BanditSelector(BanditConfig(strategies=["8_4_32"], bs_threshold=16), calibration=calibration(SPACE))
    assert policy.strategies == [BIG, DISABLE]
    assert policy.choose(17) == DISABLE
    policy.observe(make_round(DISABLE, [0] * 17, 0.01))  # not learned from
    assert policy.telemetry().timeline[0].reason == "bs_threshold"
    assert policy.choose(16) == BIG


def test_accept_length_reward_ignores_cost():
    policy = BanditSelector(BanditConfig(strategies=SPACE, reward="accept_length"), calibration=calibration(SPACE))
    chosen = run(policy, [64] * 200, seed=3)
    assert chosen[-50:].count(DISABLE) == 0  # even where a 32-token tree costs far more than plain


def test_plain_time_estimate():
    policy = BanditSelector(BanditConfig(strategies=SPACE), calibration=calibration(SPACE))
    plain = policy.times.plain_seconds(8)
    assert plain == pytest.approx(0.010)

    def stats(arm: Strategy, emitted: list[int], seconds: float) -> RoundStats:
        return RoundStats(arm, 8, [3] * 8, [n - 1 for n in emitted], emitted, seconds)

    assert policy.plain_time_estimate(stats(DISABLE, [1] * 8, 0.02)) == 0.02  # a plain round is its own estimate
    assert policy.plain_time_estimate(stats(BIG, [3] * 4 + [1] * 4, 0.05)) == pytest.approx(plain * 2.0)
    assert BanditSelector(BanditConfig(strategies=SPACE)).plain_time_estimate(stats(BIG, [3] * 8, 0.05)) == 0.0


def test_state_dict_round_trip_continues_identically():
    config = BanditConfig(strategies=SPACE, window_size=8)
    batches = [64 - i // 10 for i in range(400)] + [3] * 100 + [1] * 100
    policy = BanditSelector(config, calibration=calibration(SPACE))
    run(policy, batches[:350], seed=1)
    state = json.loads(json.dumps(policy.state_dict()))  # survives JSON
    resumed = BanditSelector(BanditConfig(strategies=SPACE, window_size=8))
    resumed.load_state_dict(state)
    assert resumed.state_dict() == policy.state_dict()
    tail = batches[350:]
    continued = run(policy, tail, seed=2)
    assert run(resumed, tail, seed=2) == continued
    assert resumed.state_dict() == policy.state_dict()
    assert resumed.telemetry() == policy.telemetry()
    said = (
        r"different BanditConfig: epsilon: saved 0.1, this selector's 0.3; window_size: saved 8, this selector's 128$"
    )
    with pytest.raises(ValueError, match=said):  # every differing key, with both values
        BanditSelector(BanditConfig(strategies=SPACE, epsilon=0.3)).load_state_dict(state)
    with pytest.raises(ValueError, match="version 1"):
        resumed.load_state_dict(state | {"version": 1})
    with pytest.raises(ValueError, match="version 2 per-arm time ratios"):
        resumed.warm_start(state | {"version": 2})
    with pytest.raises(ValueError, match="version 3 held round times as running means"):
        resumed.warm_start(state | {"version": 3})


def _entries(obj, at=()):
    """Paths to every entry of a JSON value."""
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, list):
        items = enumerate(obj)
    else:
        return
    for key, value in items:
        yield (*at, key)
        yield from _entries(value, (*at, key))


def test_a_damaged_state_is_one_value_error_and_loads_nothing():
    """Resuming used to load a damaged state part-way, or take it and fail rounds later (a huge variance: a math
    domain error mid-decode; a timeline entry short by one: an unpack error): every one-entry damage is now a
    ValueError, and the selector is as it was; a damage that loads leaves a bandit that runs and saves."""
    config = BanditConfig(strategies=SPACE, window_size=8)
    policy = BanditSelector(config, calibration=calibration(SPACE))
    run(policy, [64 - i // 10 for i in range(300)] + [2] * 50, seed=3)
    state = json.loads(json.dumps(policy.state_dict()))
    paths = list(_entries(state))
    rng = random.Random(11)
    bad_values = [None, "x", -1, 1.5, float("nan"), float("inf"), 1e30, True, [], {}, [1, 2]]
    loaded = refused = 0
    for _ in range(400):
        damaged = json.loads(json.dumps(state))
        *parents, last = rng.choice(paths)
        holder = damaged
        for key in parents:
            holder = holder[key]
        holder[last] = rng.choice(bad_values)
        fresh = BanditSelector(config)
        before = fresh.state_dict()
        try:
            fresh.load_state_dict(damaged)
        except ValueError:
            refused += 1
            assert fresh.state_dict() == before
            continue
        loaded += 1
        run(fresh, [4] * 20, seed=5)
        json.dumps(fresh.state_dict(), allow_nan=False)
    assert refused > 300 and loaded > 0
    for key in (*RESUMED_KEYS, *RESUMED_NULLABLE_KEYS):  # an entry missing: named, and nothing loaded
        fresh = BanditSelector(config)
        before = fresh.state_dict()
        with pytest.raises(ValueError, match=key):
            fresh.load_state_dict({k: v for k, v in state.items() if k != key})
        assert fresh.state_dict() == before


def test_warm_start_carries_calibration_and_acceptance_across_configs():
    policy = BanditSelector(BanditConfig(strategies=SPACE), calibration=calibration(SPACE))
    run(policy, [1] * 200, seed=0)
    fresh = BanditSelector(BanditConfig(strategies=["8_4_32", "8_4_8", "disable"]))
    fresh.warm_start(json.loads(json.dumps(policy.state_dict())))
    assert fresh.times.calibration() is not None
    assert fresh.acceptance.state()[str(BIG)] == policy.acceptance.state()[str(BIG)]  # the counts carried as they were
    # the prediction pools the arms a tree contains: without 8_4_16's rows it moves, but hardly
    assert fresh.acceptance.tokens_per_row(BIG) == pytest.approx(policy.acceptance.tokens_per_row(BIG), rel=0.01)
    assert fresh.choose(1) == BIG  # no exploration to pay again
    assert fresh.telemetry().timeline[0].reason == "exploit"


def test_telemetry():
    policy = BanditSelector(BanditConfig(strategies=SPACE, timeline_limit=50), calibration=calibration(SPACE))
    run(policy, [1] * 60 + [64] * 40, seed=0)
    telemetry = policy.telemetry()
    assert [b.label for b in telemetry.buckets] == ["1", "2-4", "5-20", "21+"]
    assert [b.rounds for b in telemetry.buckets] == [60, 0, 0, 40]
    assert sum(a.pulls for a in telemetry.buckets[0].arms) == 60
    pulled = [a for a in telemetry.buckets[0].arms if a.pulls]
    assert pulled and all(a.window_mean is not None and a.all_time_mean is not None for a in pulled)
    assert all(a.estimate is not None and a.round_time_s is not None for b in telemetry.buckets for a in b.arms)
    assert all(a.pulls == 0 and a.window_mean is None for a in telemetry.buckets[1].arms)
    assert len(telemetry.timeline) == 50  # bounded
    assert telemetry.timeline[-1].round == 99
    assert [c.batch_size for c in telemetry.timeline[-40:]] == [64] * 40
    assert {c.reason for c in telemetry.timeline} <= {"explore", "exploit", "held"}


def test_stopping_chains_count_their_stops_and_pool_only_with_their_own_stop():
    """A chain that stops early counts its stop as a miss, so its rows teach only chains with the same stop; the
    fixed chains that contain it are its (optimistic) prior and are never pulled down by its rows."""
    from fastrl.adaptive.depth_acceptance import twins

    fixed, stop5, stop8, other = (Strategy.parse(s) for s in ("7_1_8", "5_1_6@0.3", "8_1_9@0.3", "8_1_9@0.5"))
    assert contains(fixed, stop5) and not contains(stop8, Strategy.parse("3_1_4"))
    assert contains(stop8, stop5) and not contains(stop8, Strategy.parse("5_1_6@0.5")) and not contains(stop5, stop8)
    assert twins(stop5, stop8) and not twins(stop8, other) and not twins(fixed, stop5)
    acceptance = DepthAcceptance([fixed, stop5, stop8, other, DISABLE], prior_rows=4.0, memory_rows=1e9)
    for _ in range(50):  # the fixed chain accepts 5 of 7; the stopping one stops after 2 drafts, both accepted
        acceptance.observe(make_round(fixed, [5] * 8, 0.01))
    assert acceptance.tokens_per_row(stop5) > 4.5  # the fixed chain's acceptance, before any row of its own
    before = acceptance.tokens_per_row(other)
    assert before > 4.5
    for _ in range(50):
        acceptance.observe(RoundStats(stop5, 8, [2] * 8, [2] * 8, [3] * 8, 0.01))
    assert acceptance.tokens_per_row(stop5) == pytest.approx(3.0, abs=0.15)
    assert acceptance.tokens_per_row(stop8) == pytest.approx(3.0, abs=0.4)  # never pulled: its twin's rows
    assert acceptance.tokens_per_row(fixed) == pytest.approx(6.0, abs=0.15)  # not dragged down by the stops
    assert acceptance.tokens_per_row(other) == pytest.approx(before, rel=0.05)  # another stop learns nothing


def test_bandit_picks_a_stopping_chain_that_wins():
    """Rows accept each draft with chance 0.8; the stopping chain drafts one token past the first miss (a perfect
    stop), so it emits what the 8-deep chain does at nearly the 1-token cost; the bandit finds it."""
    space = ["5_1_6", "8_1_9@0.3", "disable"]
    policy = BanditSelector(BanditConfig(strategies=space), calibration=calibration(space))
    rng = random.Random(3)
    chosen = []
    for _ in range(400):
        strategy = policy.choose(1)
        chosen.append(strategy)
        if strategy.is_disabled:
            policy.observe(make_round(strategy, [0], seconds_of(strategy, 1)))
            continue
        accepted = 0
        while accepted < strategy.steps and rng.random() < 0.8:
            accepted += 1
        drafted = min(strategy.steps, accepted + 1) if strategy.stops_early else strategy.steps
        seconds = 0.012 + 0.0002 * (drafted + 1)
        policy.observe(RoundStats(strategy, 1, [drafted], [accepted], [accepted + 1], seconds))
    assert chosen[-100:].count(Strategy.parse("8_1_9@0.3")) >= 90


def test_an_ema_controllers_state_is_named_as_such_where_a_bandits_is_expected():
    """The verl server saves any selector's state as bandit_state_<server>.json; export-drafter said an EMA
    controller's state was an old epsilon-greedy bandit's ("version 1 ... window of rewards")."""
    from fastrl.adaptive.bandit_state_check import check_state_values
    from fastrl.adaptive.ema import EmaSelector
    from fastrl.adaptive.ema_config import EmaConfig

    state = json.loads(json.dumps(EmaSelector(EmaConfig()).state_dict()))
    with pytest.raises(ValueError, match=r"the state of an EMA tier controller \(strategy=ema\), not of a bandit"):
        check_state_values(state)
    bandit = BanditSelector(BanditConfig(strategies=SPACE)).state_dict()
    with pytest.raises(ValueError, match=r"timed_by_state\[0\]"):
        check_state_values(bandit | {"timed_by_state": [3]})


@pytest.mark.parametrize(
    ("state", "said"),
    [
        ([1, 2], "not a bandit state: expected a JSON object, got an array"),
        ("state", "not a bandit state: expected a JSON object, got a string"),
        ({"acceptance": {}}, 'not a bandit state: it has no "version"'),
        ({"version": "4"}, 'bandit state "version" is "4", a string: expected the integer 4'),
        ({"version": 4.0}, 'bandit state "version" is 4.0, a number: expected the integer 4'),
        ({"version": None}, 'bandit state "version" is null: expected the integer 4'),
        ({"version": 3}, r"bandit state version 3 != 4 \(version 3 held"),
    ],
)
def test_a_state_of_the_wrong_kind_or_version_says_what_it_is(state, said):
    """An array, or a version that is not an integer, said "bandit state version None != 4" (or "'4' != 4"); a
    version of 4.0 passed as 4."""
    from fastrl.adaptive.bandit_state_check import check_state_version

    with pytest.raises(ValueError, match=said):
        check_state_version(state)
