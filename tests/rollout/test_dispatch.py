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


def test_prompts_go_back_to_their_worker_within_the_balance():
    from fastrl.rollout.dispatch import PromptAffinity

    def group_req(i: int, group: int, prompt: list[int]) -> RolloutRequest:
        return RolloutRequest(f"r{i}", prompt, SamplingParams(max_new_tokens=10, seed=0), group=group)

    prompts = [[1, 2, g] for g in range(6)]
    requests = [group_req(i, i // 2, prompts[i // 2]) for i in range(12)]
    units = make_units(requests, num_workers=2)
    assert [u.prompt for u in units] == [tuple(p) for p in prompts]
    first = {u.prompt: w for w, u in assign_units(units, {"a": 0.0, "b": 0.0})}
    # Next step, the same prompts in another order: each returns to its worker, and the balance holds.
    again = make_units(list(reversed(requests)), num_workers=2)
    load = {"a": 0.0, "b": 0.0}
    second = {u.prompt: w for w, u in assign_units(again, load, homes=first)}
    assert second == first and load["a"] == load["b"]
    # A home that would unbalance the batch is overridden.
    skewed = {tuple(p): "a" for p in prompts}
    load = {"a": 0.0, "b": 0.0}
    assign_units(units, load, homes=skewed)
    assert abs(load["a"] - load["b"]) <= 2 * 20.3
    affinity = PromptAffinity(capacity=2)
    for g in range(3):
        affinity.record((g,), g)
    assert affinity.home((0,)) is None and affinity.home((2,)) == 2
    with pytest.raises(ValueError, match="capacity"):
        PromptAffinity(capacity=0)


def test_prompt_affinity_state_round_trips_and_refuses_what_it_did_not_write():
    from fastrl.rollout.dispatch import PromptAffinity

    affinity = PromptAffinity(capacity=3)
    for prompt, slot in (((1, 2), 0), ((3,), 1), ((1, 2), 1), ((4, 5, 6), 0)):
        affinity.record(prompt, slot)
    state = affinity.state()
    assert state == [[[3], 1], [[1, 2], 1], [[4, 5, 6], 0]]  # least recently served first
    again = PromptAffinity(capacity=3)
    again.load_state(state)
    assert again.state() == state and again.home((1, 2)) == 1 and again.home((9,)) is None
    snapshot = affinity.snapshot()  # the table at a rollout's end: later records do not change it
    affinity.record((7,), 0)
    affinity.record((3,), 0)
    assert affinity.state(snapshot) == state and affinity.state() == [[[4, 5, 6], 0], [[7], 0], [[3], 0]]
    smaller = PromptAffinity(capacity=2)
    smaller.load_state(state)
    assert smaller.state() == state[1:]  # the least recent go first, as when recording
    for bad in ({"a": 1}, [[[1], -1]], [[[1.5], 0]], [[[1], 0, 2]], [["12", 0]]):
        with pytest.raises(ValueError, match="prompt affinity: expected"):
            PromptAffinity().load_state(bad)


def test_merged_units_keep_their_requests_in_order_in_at_most_the_calls_given():
    from fastrl.rollout.dispatch import WorkUnit, merge_units

    units = [WorkUnit([2 * i, 2 * i + 1], 10.0 + i, (i,)) for i in range(7)]
    for calls in range(1, 9):
        merged = merge_units(units, calls)
        assert len(merged) == min(calls, 7)
        assert [i for u in merged for i in u.indices] == list(range(14))  # the worker queues them in this order
        assert sum(u.work for u in merged) == sum(u.work for u in units)
        assert max(len(u.indices) for u in merged) - min(len(u.indices) for u in merged) <= 2  # near-equal
    assert merge_units(units, 7) == units
    with pytest.raises(ValueError, match="calls must be >= 1"):
        merge_units(units, 0)


def test_replacements_are_adopted_into_their_own_slots_and_dead_ones_left_out():
    """A worker, then its replacement, lost in one rollout: the dead replacement was adopted into the dead entry
    and the live one appended (two workers in slot 0, three in all; checkpoints are written by entry). Two slots lost
    in the other order swapped their workers' entries. Every order of losses, at random."""
    import random

    from fastrl.rollout.rollout_run import WorkerHandle, adopt_replacements

    rng = random.Random(0)
    for _ in range(200):
        workers = [WorkerHandle(f"worker-{i}", None, slot=i) for i in range(rng.randint(1, 4))]
        run, latest, made = list(workers), {w.slot: w for w in workers}, len(workers)
        for _ in range(rng.randint(0, 6)):  # losses, each replaced at once, the replacement possibly lost later
            slot = rng.randrange(len(workers))
            latest[slot].alive = False
            latest[slot] = WorkerHandle(f"worker-{made}", None, slot=slot)
            run.append(latest[slot])
            made += 1
        adopted = adopt_replacements(workers, run)
        assert [w.slot for w in adopted] == list(range(len(workers)))  # one entry per slot, in slot order
        assert all(w is latest[w.slot] for w in adopted)  # each slot's live worker


def test_params_of_none_are_the_defaults_and_others_are_refused_naming_the_request():
    """``with_seeds`` read ``r.params.seed``: params=None or a dict was an AttributeError before any check ran.
    None means the defaults (as ``Engine.check_request`` takes it); anything else not a SamplingParams is refused
    in the engine's words, naming the request."""
    bare = RolloutRequest("bn", [3, 4], None)
    [seeded] = with_seeds([bare], random.Random(0))
    assert seeded.params == SamplingParams(seed=seeded.params.seed) and seeded.params.seed is not None
    assert bare.params is None  # the caller's request is not modified
    with pytest.raises(ValueError, match=r"^request 'bd': params must be a SamplingParams, got dict$"):
        with_seeds([req(0, 0), RolloutRequest("bd", [3, 4], {"max_new_tokens": 4})], random.Random(0))


@pytest.mark.parametrize("token", [4.5, True, "7", None])
def test_a_prompt_id_that_is_not_an_integer_is_refused_as_the_engine_refuses_it(token):
    """The driver refuses such a prompt before any worker sees the batch, with the engine's own message."""
    import numpy as np
    import torch

    from fastrl.rollout.dispatch import check_prompts

    bad = RolloutRequest("bf", [3, token, 6], SamplingParams())
    with pytest.raises(ValueError) as driver:
        check_prompts([req(0, 0), bad, req(1, 0)])
    assert str(driver.value) == f"request 'bf': prompt ids must be integers, got {token!r} ({type(token).__name__})"
    check_prompts([req(0, 0), RolloutRequest("np", [3, *np.arange(2), torch.tensor(5)], SamplingParams())])
