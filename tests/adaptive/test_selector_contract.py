"""The selector interface: RoundStats (its validation: tests/strategy/test_round_stats.py), StrategySelector,
FixedSelector, build_selector, config validation."""

import json

import pytest

from fastrl.adaptive import BanditConfig, BanditSelector, EmaConfig, EmaSelector, FixedSelector, build_selector
from fastrl.adaptive.buckets import BatchBuckets
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.selector import StrategySelector
from fastrl.strategy.strategy import DISABLE, Strategy


def test_round_stats_properties():
    stats = RoundStats(Strategy(8, 4, 16), 4, [15] * 4, [3, 0, 5, 8], [4, 1, 6, 2], 0.02, 0.005, 0.012)
    assert stats.total_emitted == 13
    assert stats.mean_accept_length == pytest.approx(13 / 4)  # the tokens emitted: the last row stopped at 2 of 9
    assert stats.acceptance_rate == pytest.approx(16 / 60)  # the drafter's agreement counts all 8 of its accepts
    assert stats.goodput == pytest.approx(13 / 0.02)
    plain = RoundStats(DISABLE, 2, [0, 0], [0, 0], [1, 1], 0.01)
    assert plain.mean_accept_length == 1.0
    assert plain.acceptance_rate == 0.0
    assert plain.goodput == pytest.approx(200.0)


@pytest.mark.parametrize("name", ["bandit", "ema", "disable", "8_4_32"])
def test_every_policy_implements_the_protocol(name):
    policy = build_selector(name)
    assert isinstance(policy, StrategySelector)
    for batch in (64, 17, 3, 1):
        strategy = policy.choose(batch)
        assert strategy in policy.strategies
        drafted = 0 if strategy.is_disabled else strategy.num_draft_tokens - 1
        accepted = min(1, drafted)
        policy.observe(RoundStats(strategy, batch, [drafted] * batch, [accepted] * batch, [accepted + 1] * batch, 0.01))
    state = json.loads(json.dumps(policy.state_dict()))
    twin = build_selector(name)
    twin.load_state_dict(state)
    assert twin.state_dict() == policy.state_dict()


def test_fixed_selector():
    policy = FixedSelector("8_4_32")
    assert policy.strategies == [Strategy(8, 4, 32)]
    assert policy.choose(1) == policy.choose(128) == Strategy(8, 4, 32)
    assert FixedSelector(DISABLE).choose(5) == DISABLE
    with pytest.raises(ValueError, match="batch_size"):
        policy.choose(0)
    with pytest.raises(ValueError, match="'8_4_16'"):
        policy.load_state_dict(FixedSelector("8_4_16").state_dict())


def test_build_selector():
    assert isinstance(build_selector("bandit"), BanditSelector)
    assert build_selector("bandit", bandit={"strategies": ["3_1_4", "disable"]}).strategies == [
        Strategy(3, 1, 4),
        DISABLE,
    ]
    config = BanditConfig(epsilon=0.2)
    assert build_selector("bandit", bandit=config).config is config
    assert isinstance(build_selector("ema"), EmaSelector)
    assert build_selector("ema", ema={"candidate_steps": [2, 5]}).strategies == [Strategy(2, 1, 3), Strategy(5, 1, 6)]
    assert build_selector("ema", ema=EmaConfig(candidate_steps=[4])).choose(1) == Strategy(4, 1, 5)
    assert build_selector("disable").choose(3) == DISABLE
    assert build_selector("3_1_4").choose(3) == Strategy(3, 1, 4)
    with pytest.raises(ValueError, match="strategy selector 'greedy'"):
        build_selector("greedy")
    with pytest.raises(ValueError, match="'3_1_5'"):
        build_selector("3_1_5")
    with pytest.raises(ValueError, match="unknown BanditConfig keys: \\['eps'\\]"):
        build_selector("bandit", bandit={"eps": 0.1})


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"strategies": []}, "strategies"),
        ({"strategies": ["8_4_32", "8_4_32"]}, "strategies"),
        ({"strategies": ["8_4_32", "9_9"]}, "strategies"),
        ({"bs_thresholds": [1, 5, 2]}, "bs_thresholds"),
        ({"bs_thresholds": [1, 2, 2]}, "bs_thresholds"),
        ({"bs_thresholds": [0, 2]}, "bs_thresholds"),
        ({"bs_thresholds": [-1, 2]}, "bs_thresholds"),
        ({"bs_thresholds": [2, 5]}, "bs_thresholds"),
        ({"bs_thresholds": []}, "bs_thresholds"),
        ({"epsilon": -0.1}, "epsilon"),
        ({"epsilon": 1.5}, "epsilon"),
        ({"epsilon": float("nan")}, "epsilon"),
        ({"window_size": 0}, "window_size"),
        ({"reward": "speed"}, "reward"),
        ({"bs_threshold": 0}, "bs_threshold"),
        ({"prior_rows": -1}, "prior_rows"),
        ({"explore_within": 1.5}, "explore_within"),
        ({"calibrate": "yes"}, "calibrate"),
        ({"bucket_strategies": {3: ["disable"]}}, r"bucket_strategies\[3\]"),
        ({"bucket_strategies": {2: ["3_1_4"]}}, r"bucket_strategies\[2\]"),
        ({"bucket_strategies": {2: []}}, r"bucket_strategies\[2\]"),
        ({"timeline_limit": -1}, "timeline_limit"),
        ({"timeline_limit": True}, "timeline_limit"),
        ({"window_size": 10**400}, r"window_size must be an int in \[1, 1_000_000_000\], got an int of 401 digits"),
        ({"bs_threshold": True}, "bs_threshold"),
        ({"min_pulls": 10**9}, r"min_pulls must be an integer in \[1, 1000\], got 1000000000"),  # calibrates for ever
        ({"bucket_strategies": {1: None}}, r"bucket_strategies\[1\] must be a list of strategy strings, got None"),
        ({"bucket_strategies": {"\u00b2": ["disable"]}}, r"bucket_strategies\['\u00b2'\]: not a bucket threshold"),
        ({"bucket_strategies": {"\u0661": ["disable"]}}, r"bucket_strategies\['\u0661'\]: not a bucket threshold"),
        ({"bucket_strategies": {True: ["disable"]}}, r"bucket_strategies\[True\]: not a bucket threshold"),
    ],
)
def test_bandit_config_errors_name_the_key(values, key):
    with pytest.raises(ValueError, match=f"BanditConfig.{key}"):
        BanditConfig.from_dict(values)


def test_bandit_config_unknown_keys():
    with pytest.raises(ValueError, match=r"unknown BanditConfig keys: \['alpha', 'window'\]"):
        BanditConfig.from_dict({"window": 3, "alpha": 0.1, "epsilon": 0.1})


def test_batch_buckets():
    buckets = BatchBuckets((1, 2, 5, 21))
    assert [buckets.index(b) for b in (1, 2, 4, 5, 20, 21, 500)] == [0, 1, 1, 2, 2, 3, 3]
    assert buckets.labels() == ["1", "2-4", "5-20", "21+"]
    with pytest.raises(ValueError, match="batch_size"):
        buckets.index(0)
