"""Merging rollout workers' bandit states pools what each learned; a merged state loads into a bandit."""

import pytest

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.bandit_merge import merge_bandit_states
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy


def _worker(batch: int, seconds: float) -> BanditSelector:
    selector = BanditSelector(BanditConfig(strategies=["3_1_4", "disable"], bs_thresholds=[1, 8]))
    spec = Strategy.parse("3_1_4")
    for _ in range(3):
        selector.observe(RoundStats(spec, batch, [3] * batch, [2] * batch, [3] * batch, seconds))
        selector.observe(RoundStats(DISABLE, batch, [0] * batch, [0] * batch, [1] * batch, seconds / 2))
    return selector


def test_merged_state_sums_counts_and_loads():
    a, b = _worker(1, 0.01), _worker(16, 0.05)
    merged = merge_bandit_states([a.state_dict(), b.state_dict()])
    sa, sb = a.state_dict(), b.state_dict()
    assert merged["round"] == sa["round"] + sb["round"]
    assert merged["bucket_rounds"] == [x + y for x, y in zip(sa["bucket_rounds"], sb["bucket_rounds"], strict=True)]
    for arm, (hits, trials) in merged["acceptance"].items():
        assert trials == [x + y for x, y in zip(sa["acceptance"][arm][1], sb["acceptance"][arm][1], strict=True)]
        assert hits == [x + y for x, y in zip(sa["acceptance"][arm][0], sb["acceptance"][arm][0], strict=True)]
    fresh = BanditSelector(BanditConfig(strategies=["3_1_4", "disable"], bs_thresholds=[1, 8]))
    fresh.load_state_dict(merged)
    pulls = {bucket.label: sum(arm.pulls for arm in bucket.arms) for bucket in fresh.telemetry().buckets}
    assert pulls == {bucket.label: 6 for bucket in fresh.telemetry().buckets}


def test_stopping_chains_depths_and_tokens_are_averaged_by_their_rounds():
    space = ["12_1_13@0.3", "disable"]
    stop = Strategy.parse(space[0])
    workers = [BanditSelector(BanditConfig(strategies=space)) for _ in range(2)]
    for worker, depth, rounds in ((workers[0], 2, 30), (workers[1], 6, 10)):
        for _ in range(rounds):
            worker.observe(RoundStats(stop, 1, [depth], [depth], [depth + 1], 0.01))
    workers[1].observe(RoundStats(stop, 8, [9] * 8, [3] * 8, [4] * 8, 0.02))
    merged = merge_bandit_states([w.state_dict() for w in workers])
    assert merged["chain_rounds"][str(stop)]["0"] == pytest.approx([3.0, 4.0, 40.0])  # (2 x 30 + 6 x 10) / 40
    assert merged["chain_rounds"][str(stop)]["3"] == pytest.approx([9.0, 4.0, 1.0])
    fresh = BanditSelector(BanditConfig(strategies=space))
    fresh.load_state_dict(merged)
    assert fresh.times.calibration() is None  # no line without a calibration, but the rounds are there
    assert fresh.state_dict()["chain_rounds"] == merged["chain_rounds"]


def test_states_of_different_configs_are_refused():
    other = BanditSelector(BanditConfig(strategies=["5_1_6", "disable"], bs_thresholds=[1, 8]))
    with pytest.raises(ValueError, match="different configs"):
        merge_bandit_states([_worker(1, 0.01).state_dict(), other.state_dict()])
    with pytest.raises(ValueError, match="non-empty list"):
        merge_bandit_states([])
