"""Dispatch: groups stay together unless one holds more than a worker's fair share; LPT balance; seeds."""

from __future__ import annotations

import random

import pytest

from fastrl.rollout.dispatch import assign_units, check_request_ids, make_units, with_seeds
from fastrl.rollout.types import RolloutRequest
from fastrl.sampling.params import SamplingParams


def req(i: int, group: int, new: int = 10, seed: int | None = 0) -> RolloutRequest:
    return RolloutRequest(f"r{i}", [1, 2, 3], SamplingParams(max_new_tokens=new, seed=seed), group=group)


def test_groups_stay_together_and_load_balances():
    requests = [req(i, group=i // 4, new=10 * (1 + i // 4)) for i in range(16)]  # groups of work 40..160
    units = make_units(requests, num_workers=2)
    assert sorted(tuple(u.indices) for u in units) == [tuple(range(g * 4, g * 4 + 4)) for g in range(4)]
    load = {"a": 0.0, "b": 0.0}
    plan = assign_units(units, load)
    assert len(plan) == 4 and abs(load["a"] - load["b"]) <= 41.3


def test_a_group_larger_than_a_fair_share_is_split():
    requests = [req(i, group=0) for i in range(8)] + [req(8, group=1)]
    units = make_units(requests, num_workers=2)
    assert sorted(len(u.indices) for u in units) == [1, 4, 4]
    assert sorted(i for u in units for i in u.indices) == list(range(9))
    assert len(make_units(requests, num_workers=1)) == 2


def test_seeds_filled_deterministically_and_ids_checked():
    requests = [req(0, 0, seed=None), req(1, 0, seed=5)]
    a, b = with_seeds(requests, random.Random(3)), with_seeds(requests, random.Random(3))
    assert a[0].params.seed == b[0].params.seed is not None and a[1] is requests[1]
    assert requests[0].params.seed is None  # the caller's requests are not modified
    with pytest.raises(ValueError, match="r0"):
        check_request_ids([req(0, 0), req(0, 1)])
    with pytest.raises(ValueError, match="no workers"):
        assign_units([], {})
