"""Merging rollout workers' bandit states pools what each learned, whatever the workers' order; a merged state loads
into a bandit; its exported per-bucket winners do not follow one worker's last batch size."""

import itertools
import json

import pytest

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.bandit_merge import merge_bandit_states
from fastrl.adaptive.cost_model import CostModel
from fastrl.integrations.export.selection_config import bucket_winners, disable_reason
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


def _calibrated(batches: list[int], plain_every: int) -> BanditSelector:
    """A worker of a bandit whose calibration has 3_1_4 win at batch 5-10 and plain at 20 and above, after rounds at
    ``batches``, a plain one every ``plain_every``."""
    chain = Strategy.parse("3_1_4")
    times = {1: 0.012, 8: 0.014, 64: 0.2}
    points = [(DISABLE, b, 0.01 + 0.0002 * b) for b in times] + [(chain, b, t) for b, t in times.items()]
    selector = BanditSelector(BanditConfig(strategies=["3_1_4", "disable"]), CostModel.fit(points))
    for i, b in enumerate(batches):
        spec = DISABLE if i % plain_every == 0 else chain
        selector.observe(RoundStats(spec, b, [2] * b, [1] * b, [2] * b, 0.01 + 0.001 * b * (i % 3)))
    return selector


def test_the_merge_and_the_winners_do_not_depend_on_the_workers_order():
    """Three workers' states in any of their six orders merge into one state (the first worker's last batch,
    exploration credit and rounds since plain were the merge's) and export one set of winners."""
    workers = [_calibrated([5, 12, 12, 20], 2), _calibrated([20, 20, 7], 5), _calibrated([3, 9, 5, 5, 21, 6], 4)]
    states = [json.loads(json.dumps(w.state_dict())) for w in workers]
    merged = [merge_bandit_states(list(order)) for order in itertools.permutations(states)]
    assert all(json.dumps(m, sort_keys=True) == json.dumps(merged[0], sort_keys=True) for m in merged)
    assert len({tuple(bucket_winners(m)) for m in merged}) == 1
    assert merged[0]["explore_credit"] == min(s["explore_credit"] for s in states)
    assert merged[0]["since_plain"] == min(s["since_plain"] for s in states)
    assert merged[0]["last_batch"][2] == 6  # bucket 5-20: 4 rounds in the first (last 20) and the third (last 6)
    assert (merged[0]["explore_best"], merged[0]["explore_seconds"], merged[0]["stretch"]) == (None, 0.0, None)


def test_bucket_winners_are_predicted_at_a_batch_size_of_the_bucket_not_the_last_one_run():
    """3_1_4 wins at batch 5 and 10, plain at 20: a bucket 5-20 whose last round ran at 5 or at 20 exports the
    winner at its geometric middle, 10, either way."""
    state = json.loads(json.dumps(_calibrated([], 1).state_dict()))
    winners = []
    for last in (5, 20):
        state["last_batch"][2] = last
        winners.append(bucket_winners(state))
    assert winners[0] == winners[1]
    assert [(w.label, w.batch_size, str(w.strategy)) for w in winners[0]][1:3] == [
        ("2-4", 3, "3_1_4"),
        ("5-20", 10, "3_1_4"),
    ]


@pytest.mark.parametrize("threshold", [1, 2, 4, 7, 9, 10, 12, 20, 30, 50])
def test_the_export_decodes_plainly_exactly_where_the_bandit_does(threshold):
    """Past bs_threshold the bandit decodes plainly whatever its arms predict; the export wrote a bucket's predicted
    winner there (3_1_4 for the bucket 5-20 at threshold 4), also where the threshold fell inside a bucket: batch
    sizes 13-20 exported as speculating at threshold 12, 5-7 as plain at threshold 7. At every batch size 1-60 the
    export's entry (the last one whose minimum batch size it reaches) now speculates iff the bandit may."""
    state = json.loads(json.dumps(_calibrated([], 1).state_dict()))
    state["config"]["bs_threshold"] = threshold
    winners = bucket_winners(state)
    assert [w.min_batch_size for w in winners] == sorted({w.min_batch_size for w in winners})
    for batch in range(1, 61):
        entry = [w for w in winners if w.min_batch_size <= batch][-1]
        if batch > threshold:
            assert entry.strategy == DISABLE and entry.bs_threshold == threshold, (batch, entry)
            assert f"past the bandit's bs_threshold={threshold}" in disable_reason(entry)
        else:
            assert entry.bs_threshold is None and entry.batch_size <= threshold, (batch, entry)
