"""RoundStats refuses what no round can report, naming the field and the value: a selector that learned from an
infinite or denormal wall time saved a state no JSON holds."""

from __future__ import annotations

import json
import math
import re

import pytest

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.strategy.round_stats import MAX_WALL_TIME_S, MIN_WALL_TIME_S, RoundStats
from fastrl.strategy.strategy import Strategy

ARM = Strategy.parse("3_1_4")


def _stats(**fields) -> RoundStats:
    """A valid round of 3_1_4 at batch 2, with ``fields`` replaced."""
    values = dict(
        strategy=ARM,
        batch_size=2,
        drafted_tokens=[3, 3],
        accepted_tokens=[1, 2],
        emitted_tokens=[2, 3],
        wall_time_s=0.01,
    )
    return RoundStats(**(values | fields))


@pytest.mark.parametrize(
    "field, value",
    [
        ("wall_time_s", math.inf),
        ("wall_time_s", math.nan),
        ("wall_time_s", 5e-324),  # 2 tokens / 5e-324 s is an infinite goodput
        ("wall_time_s", 0.0),
        ("wall_time_s", 1.7e308),  # a few of these sum to infinity
        ("wall_time_s", "0.01"),
        ("draft_time_s", math.nan),
        ("draft_time_s", -1.0),
        ("verify_time_s", math.inf),
        ("plain_time_estimate_s", math.nan),
        ("plain_time_estimate_s", -1.0),
        ("catch_up_time_s", math.nan),
    ],
)
def test_times_must_be_finite_seconds_and_the_error_names_the_field_and_value(field, value):
    with pytest.raises(ValueError, match=rf"RoundStats\.{field} must be .* got {re.escape(repr(value))}$"):
        _stats(**{field: value})


@pytest.mark.parametrize(
    "field, value, said",
    [
        ("accepted_tokens", [1, math.nan], r"accepted_tokens\[1\] must be an integer >= 0, got nan"),
        ("emitted_tokens", [2, -1], r"emitted_tokens\[1\] must be an integer >= 0, got -1"),
        ("drafted_tokens", [3], r"drafted_tokens must be a list of one count per row \(batch_size 2\), got 1 rows"),
        ("accepted_tokens", [1, 4], r"accepted_tokens\[1\] is 4, more than drafted_tokens\[1\] = 3"),
        ("batch_size", 2.5, r"batch_size must be an integer >= 1, got 2.5"),
        ("batch_size", 0, r"batch_size must be an integer >= 1, got 0"),
    ],
)
def test_token_counts_are_integers_per_row_and_the_error_names_the_row(field, value, said):
    with pytest.raises(ValueError, match=said):
        _stats(**{field: value})


def test_the_bounds_are_valid_and_a_bandit_that_learned_them_saves_json():
    """The shortest and the longest round allowed keep a bandit's state finite: it dumps as strict JSON."""
    bandit = BanditSelector(BanditConfig(strategies=["3_1_4", "disable"], calibrate=False))
    for wall in (MIN_WALL_TIME_S, MAX_WALL_TIME_S, MAX_WALL_TIME_S):
        bandit.choose(2)
        bandit.observe(_stats(wall_time_s=wall, catch_up_time_s=wall / 2))
    json.dumps(bandit.state_dict(), allow_nan=False)


def test_counts_accepted_exactly_when_every_value_is_a_non_bool_integer_at_least_zero():
    """Seeded random rows mixing Python and numpy integers, bools, floats and negatives: a round is accepted iff
    every count is an integer (not a bool) >= 0, whichever kinds the fast path and the per-value check see."""
    import random

    import numpy as np

    kinds = [lambda r: r.randint(0, 9), lambda r: np.int64(r.randint(0, 9)), lambda r: np.int32(r.randint(0, 9))]
    bad = [lambda r: True, lambda r: False, lambda r: float(r.randint(0, 9)), lambda r: -r.randint(1, 9)]
    rng = random.Random(0)
    for _ in range(300):
        rows = rng.randint(1, 5)
        values = [rng.choice(kinds + (bad if rng.random() < 0.3 else []))(rng) for _ in range(rows)]
        ok = all(not isinstance(v, bool | float) and v >= 0 for v in values)
        fields = dict(batch_size=rows, drafted_tokens=[99] * rows, accepted_tokens=[0] * rows, emitted_tokens=values)
        if ok:
            assert _stats(**fields).total_emitted == sum(int(v) for v in values)
        else:
            with pytest.raises(ValueError, match=r"RoundStats\.emitted_tokens\[\d\] must be an integer >= 0"):
                _stats(**fields)
