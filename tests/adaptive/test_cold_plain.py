"""Cold plain rounds: a plain round right after another arm's costs more on a CPU (the other arm's data took the
policy's place in the processor's caches). The calibration times the penalty per batch size and context; the round
times learn such a round as the warm plain round it stands for, and the plain-time estimate prices it so (learned as
it came, plain anchors among speculative rounds priced plain decoding ~15% high at the tail's batch 1)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.bandit_merge import merge_bandit_states
from fastrl.adaptive.cost_model import COLD, CostModel
from fastrl.adaptive.round_times import RoundTimes
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy

CHAIN = Strategy.parse("3_1_4")
SIZES = (1, 8, 64)
SHORT, LONG = 22, 455


def plain_s(b: int, context: int) -> float:
    return 0.002 + 0.0002 * b + 4e-7 * b * context


def chain_s(b: int, context: int) -> float:
    return 2.6 * plain_s(b, context)


def calibration(penalty: dict[int, float] | None) -> CostModel:
    """Plain and ``3_1_4`` at two contexts; cold plain rounds ``penalty[b]`` times plain's (none when None)."""
    points = [
        (arm, b, f(b, c), c) for arm, f in ((DISABLE, plain_s), (CHAIN, chain_s)) for b in SIZES for c in (SHORT, LONG)
    ]
    cold = (
        [] if penalty is None else [(DISABLE, b, penalty[b] * plain_s(b, c), c) for b in SIZES for c in (SHORT, LONG)]
    )
    return CostModel.fit(points, cold=cold)


def round_of(arm: Strategy, b: int, seconds: float, after_other_arm: bool, context: int = LONG) -> RoundStats:
    emitted = [1 if arm.is_disabled else 3] * b
    drafted = [0 if arm.is_disabled else 3] * b
    accepted = [e - 1 for e in emitted]
    return RoundStats(
        arm, b, drafted, accepted, emitted, seconds, context_tokens=b * context, after_other_arm=after_other_arm
    )


def test_cold_rounds_round_trip_through_json_rows_and_old_rows_have_none():
    model = calibration({1: 1.2, 8: 1.1, 64: 1.05})
    rows = model.rows()
    assert sum(len(r) == 5 and r[4] == COLD for r in rows) == 6
    again = CostModel.from_rows(rows, "the cache")
    assert again.cold_measurements() == model.cold_measurements() and again.measurements() == model.measurements()
    plain_only = CostModel.from_rows([r for r in rows if len(r) == 4], "an older cache")
    assert plain_only.cold_measurements() == [] and RoundTimes(plain_only).cold_penalty(1) == 1.0


@pytest.mark.parametrize(
    ("row", "said"),
    [
        (["3_1_4", 1, 0.004, 10, COLD], r"rows\[0\] is .*a cold plain round's \[disable"),
        (["disable", 1, 0.004, 10, "warm"], r"rows\[0\] is .*seconds\(, context\)"),
        (["disable", 1, -1.0, 10, COLD], r"rows\[0\]\[2\] is -1.0"),
        (["disable", 0, 0.004, 10, COLD], r"rows\[0\]\[1\] is 0"),
    ],
)
def test_a_bad_cold_row_is_refused_naming_it(row, said):
    with pytest.raises(ValueError, match=f"the cache: .*{said}"):
        CostModel.from_rows([row], "the cache")


def test_the_penalty_follows_the_batch_size_and_context_and_is_never_below_one():
    times = RoundTimes(calibration({1: 1.25, 8: 1.1, 64: 0.9}))
    times.set_context(LONG)
    assert times.cold_penalty(1) == pytest.approx(1.25) and times.cold_penalty(8) == pytest.approx(1.1)
    assert times.cold_penalty(64) == 1.0  # a cold round timed faster than warm ones is noise: no discount
    assert 1.1 <= times.cold_penalty(4) <= 1.25
    assert RoundTimes(calibration(None)).cold_penalty(1) == 1.0


def test_a_warm_plain_round_and_other_arms_keep_their_own_time():
    times = RoundTimes(calibration({1: 1.3, 8: 1.3, 64: 1.3}))
    assert times.warm_seconds(round_of(DISABLE, 1, 0.005, after_other_arm=False)) == 0.005
    assert times.warm_seconds(round_of(CHAIN, 1, 0.005, after_other_arm=True)) == 0.005
    assert times.warm_seconds(round_of(DISABLE, 1, 0.0065, after_other_arm=True)) == pytest.approx(0.005)
    assert times.plain_estimate(round_of(DISABLE, 1, 0.0065, after_other_arm=True)) == pytest.approx(0.005)


def replay(penalty: dict[int, float], correct: bool, b: int, seed: int, rounds: int = 600) -> float:
    """Rounds at batch ``b`` of a machine whose plain rounds right after ``3_1_4`` ones cost ``penalty[b]`` x more (a
    wandering load, 15% noise), a plain anchor among every few chain rounds as the bandit takes them: the summed plain
    estimates of the chain rounds over their true plain time. ``correct``: the calibration timed the cold rounds (else
    it has none)."""
    rng = random.Random(seed)
    times = RoundTimes(calibration(penalty if correct else None))
    load, estimated, true, previous = 1.0, 0.0, 0.0, DISABLE
    for _ in range(rounds):
        load *= math.exp(rng.gauss(0.0, 0.02))
        arm = DISABLE if rng.random() < 0.15 else CHAIN
        cold = arm.is_disabled and not previous.is_disabled
        noise = math.exp(rng.gauss(0.0, 0.15))
        base = plain_s(b, LONG) * (penalty[b] if cold else 1.0) if arm.is_disabled else chain_s(b, LONG)
        stats = round_of(arm, b, base * load * noise, after_other_arm=arm != previous)
        if not arm.is_disabled:
            estimated += times.plain_estimate(stats)
            true += plain_s(b, LONG) * load * 3
        times.observe_round(stats)
        previous = arm
    return estimated / true


@settings(max_examples=12, deadline=None)
@given(st.floats(1.1, 1.6), st.sampled_from(SIZES), st.integers(0, 10_000))
def test_plain_anchors_after_other_arms_teach_plain_decoding_its_warm_price(cost, b, seed):
    penalty = {size: cost if size == b else 1.0 for size in SIZES}
    estimate = replay(penalty, True, b, seed)
    assert abs(math.log(estimate)) < 0.1  # 30 seeds: within 5.5% of the truth
    high = replay(penalty, False, b, seed)
    assert high / estimate - 1 > 0.6 * (cost - 1)  # what the calibration's cold rounds fix (30 seeds: 0.73-0.90)


def test_a_saved_and_a_merged_bandit_state_keep_the_cold_rounds():
    config = BanditConfig(strategies=["3_1_4", "disable"])
    first, second = BanditSelector(config, calibration({1: 1.3, 8: 1.1, 64: 1.0})), BanditSelector(config)
    second.set_calibration(calibration({1: 1.1, 8: 1.1, 64: 1.0}))
    restored = BanditSelector(config)
    restored.load_state_dict(first.state_dict())
    assert restored.times.cold_penalty(1) == pytest.approx(1.3)
    merged = BanditSelector(config)
    merged.load_state_dict(merge_bandit_states([first.state_dict(), second.state_dict()]))
    assert merged.times.cold_penalty(1) == pytest.approx(1.2)  # the fit's median of the two workers' rounds
