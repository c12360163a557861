"""Round costs by context: a calibration at a short and a long context, a line between them, and the context of the
rounds a prediction is made for (on short prompts a calibration at long contexts alone put the plain-time estimate
1.1-1.25x high)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.bandit_merge import merge_bandit_states
from fastrl.adaptive.cost_model import CostModel, context_time
from fastrl.adaptive.round_times import CONTEXT_STEP_KEYS, CONTEXT_STEPS, RoundTimes, context_bin
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy

CHAIN = Strategy.parse("3_1_4")
SHORT, LONG = 24, 480


def plain_s(b: int, context: float) -> float:
    """A plain round: a forward whose attention grows with the keys the rows hold."""
    return 0.003 + 0.0001 * b + 2e-7 * b * context


def chain_s(b: int, context: float) -> float:
    """A 3_1_4 round: four drafter and verify forwards, whose attention weighs less beside their weights."""
    return 0.009 + 0.0004 * b + 3e-7 * b * context


def two_contexts() -> CostModel:
    arms = ((DISABLE, plain_s), (CHAIN, chain_s))
    return CostModel.fit([(arm, b, f(b, c), c) for arm, f in arms for b in (1, 8, 64) for c in (SHORT, LONG)])


def test_context_time_is_the_line_through_the_measured_contexts():
    levels = [(SHORT, 0.010), (LONG, 0.019)]
    assert context_time(levels, SHORT) == pytest.approx(0.010) and context_time(levels, LONG) == pytest.approx(0.019)
    assert context_time(levels, 252) == pytest.approx(0.0145)  # halfway
    assert context_time(levels, 936) == pytest.approx(0.028)  # the line beyond the longest
    assert context_time(levels, 1) == pytest.approx(0.010)  # no shorter than the shortest's time
    assert context_time(levels, None) == pytest.approx(0.019)  # unknown: the longest, where rollouts spend rounds
    assert context_time([(SHORT, 0.02), (LONG, 0.01)], 5000) == pytest.approx(0.01)  # a falling line stops falling
    assert context_time([(None, 0.007)], 300) == context_time([(LONG, 0.007)], 3) == 0.007


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 100_000), min_size=1, max_size=4, unique=True),
    st.lists(st.floats(1e-6, 10.0), min_size=4, max_size=4),
    st.floats(0.5, 1e6),
)
def test_context_time_is_finite_positive_and_within_reach_of_its_levels(contexts, times, context):
    levels = sorted(zip(contexts, times[: len(contexts)], strict=True))
    got = context_time(levels, context)
    assert math.isfinite(got) and got > 0
    lo, hi = min(t for _, t in levels), max(t for _, t in levels)
    if context <= levels[-1][0]:
        assert lo <= got * (1 + 1e-9) and got <= hi * (1 + 1e-9)  # interpolated, never beyond the measured times
    else:
        assert got >= levels[-1][1] * (1 - 1e-9)  # a longer context never costs less than the longest measured


def test_a_fit_keeps_each_context_and_its_rows_round_trip():
    model = two_contexts()
    assert model.round_time(DISABLE, 8, SHORT) == pytest.approx(plain_s(8, SHORT))
    assert model.round_time(DISABLE, 8, LONG) == pytest.approx(plain_s(8, LONG))
    middle = (SHORT + LONG) / 2
    assert model.round_time(CHAIN, 8, middle) == pytest.approx(chain_s(8, middle))  # linear in the context
    again = CostModel.from_rows(model.rows(), "here")
    assert again.measurements() == model.measurements() and all(len(r) == 4 for r in model.rows())
    old = CostModel.from_rows([["disable", 1, 0.004], ["3_1_4", 1, 0.01]], "here")  # rows saved before contexts
    assert old.round_time(CHAIN, 1, 9999) == pytest.approx(0.01)
    assert old.rows() == [["disable", 1, 0.004], ["3_1_4", 1, 0.01]]


@pytest.mark.parametrize(
    ("rows", "said"),
    [
        ([["disable", 1, 0.004, 0]], "context"),
        ([["disable", 1, 0.004, 1.5]], "integers"),
        ([["disable", 1, 0.004, 10, 3]], r"seconds\(, context\)"),
        ([["disable", 1, 0.004, 10], ["disable", 2, 0.005]], "with and without a context"),
        ("rows", r"seconds\(, context\)"),
    ],
)
def test_bad_rows_are_refused_naming_where_they_came_from(rows, said):
    with pytest.raises(ValueError, match=f"the cache: .*{said}"):
        CostModel.from_rows(rows, "the cache")


def test_context_bins_hold_for_many_rounds_and_move_by_little():
    assert context_bin(None) is None and context_bin(0.2) == context_bin(11.9) == CONTEXT_STEP_KEYS
    rng = random.Random(0)
    for _ in range(2000):
        c = rng.uniform(1, 50_000)
        near = abs(context_bin(c) - c) <= CONTEXT_STEP_KEYS  # a short context: within a few keys
        assert near or abs(math.log2(context_bin(c)) - math.log2(c)) <= 0.5 / CONTEXT_STEPS + 1e-12
        assert context_bin(context_bin(c)) == context_bin(c)  # a saved bin loads as itself
    # where the fine grid gives way to the log grid (~184.7 keys), a log-grid point below the switch re-binned onto
    # the fine grid: a saved state's context read back as another
    switch = [c / 1000 for c in range(180_000, 192_000)]
    assert all(context_bin(context_bin(c)) == context_bin(c) for c in switch)
    assert all(context_bin(a) <= context_bin(b) for a, b in zip(switch, switch[1:], strict=False))
    assert len({context_bin(c) for c in range(10, 130)}) <= 16  # a short context's bin holds for 8 rounds
    assert len({context_bin(c) for c in range(400, 801)}) == CONTEXT_STEPS + 1  # a bin holds ~18 rounds at 400


def round_at(arm: Strategy, b: int, context: float, seconds: float) -> RoundStats:
    return RoundStats(arm, b, [0] * b, [0] * b, [1] * b, seconds, context_tokens=round(context * b))


def test_predictions_follow_the_context_of_the_rounds():
    times = RoundTimes(two_contexts())
    assert times.context is None and times.calibrated(DISABLE, 8) == pytest.approx(plain_s(8, LONG))
    for _ in range(30):  # rounds at short contexts, as fast as calibrated there
        times.observe_round(round_at(DISABLE, 8, 30, plain_s(8, 30)))
    assert abs(times.context - 30) <= CONTEXT_STEP_KEYS / 2
    assert times.plain_seconds(8) == pytest.approx(plain_s(8, 30), rel=0.03)
    ratio = times.seconds(CHAIN, 8) / times.plain_seconds(8)
    assert ratio == pytest.approx(chain_s(8, 30) / plain_s(8, 30), rel=0.03)  # the short context's ratio
    times.observe_round(round_at(DISABLE, 8, 400, plain_s(8, 400)))
    assert times.seconds(CHAIN, 8) / times.plain_seconds(8) == pytest.approx(
        chain_s(8, 400) / plain_s(8, 400), rel=0.03
    )


def test_the_estimate_at_short_contexts_is_a_plain_runs_time():
    """A bandit calibrated at both contexts, decoding short rows with the chain alone, estimates a plain run of
    the same rows within 3%; a calibration at the long context alone said 1.2x (the calibration's own ratio)."""
    both = two_contexts()
    long_only = CostModel.fit([(s, b, t) for s, b, t, c in both.measurements() if c == LONG])
    for calibration, low, high in ((both, 0.97, 1.03), (long_only, 1.1, 1.5)):
        selector = BanditSelector(BanditConfig(strategies=["3_1_4", "disable"], epsilon=0.0), calibration)
        estimate = real = 0.0
        for step in range(200):
            context = 12 + step % 40  # rows from a short prompt to a few dozen tokens
            stats = round_at(CHAIN, 8, context, chain_s(8, context))
            estimate += selector.plain_time_estimate(stats)
            real += plain_s(8, context)
            selector.observe(stats)
        assert low <= estimate / real <= high, (estimate / real, calibration is both)


def test_the_context_is_saved_checked_and_merged():
    selector = BanditSelector(BanditConfig(strategies=["3_1_4", "disable"]), two_contexts())
    for context in (40, 200):
        selector.observe(round_at(CHAIN, 8, context, chain_s(8, context)))
    state = selector.state_dict()
    assert state["times"]["context"] == context_bin(200) and all(len(r) == 4 for r in state["calibration"])
    again = BanditSelector(BanditConfig(strategies=["3_1_4", "disable"]))
    again.load_state_dict(state)
    assert again.times.context == context_bin(200)
    assert again.predict(CHAIN, 8) == pytest.approx(selector.predict(CHAIN, 8))
    other = BanditSelector(BanditConfig(strategies=["3_1_4", "disable"]), two_contexts())
    other.observe(round_at(CHAIN, 8, 100, chain_s(8, 100)))
    merged = merge_bandit_states([state, other.state_dict()])
    assert merged["times"]["context"] == pytest.approx((context_bin(200) + context_bin(100)) / 2)
    for bad, said in ((0.5, "times.context"), (float("inf"), "times.context"), ("long", "times.context")):
        broken = dict(state, times=dict(state["times"], context=bad))
        with pytest.raises(ValueError, match=said):
            BanditSelector(BanditConfig(strategies=["3_1_4", "disable"])).load_state_dict(broken)
    broken = dict(state, calibration=[[*state["calibration"][0][:3], 0]])
    with pytest.raises(ValueError, match=r"calibration\[0\]\[3\]"):
        BanditSelector(BanditConfig(strategies=["3_1_4", "disable"])).load_state_dict(broken)
