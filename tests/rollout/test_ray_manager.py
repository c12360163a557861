"""RayRolloutManager on a real local Ray with two worker actors: order and exactness across workers, the
concurrent request API, co-training in the tail, versioned policy pushes, and recovery from a killed worker."""

from __future__ import annotations

import threading
import time

import pytest
import ray

from fastrl.models.checkpoint import load_model
from fastrl.rollout.manager import RayRolloutManager
from fastrl.rollout.manager_config import RolloutManagerConfig
from fastrl.rollout.types import RolloutRequest
from fastrl.sampling.params import SamplingParams
from tests.rollout.conftest import assert_same_tokens, mixed_requests, prompt, reference, worker_config
from tests.rollout.faults import inject, slow_steps
from tests.rollout.tail_requests import tail_batch


@pytest.fixture(scope="module")
def manager(checkpoint, ray_cluster):
    mgr = RayRolloutManager(RolloutManagerConfig(worker=worker_config(checkpoint), num_workers=2))
    yield mgr
    mgr.shutdown()


def current_policy_dir(manager: RayRolloutManager, checkpoint) -> str:
    return checkpoint.policy_v1 if manager.policy_version == 1 else checkpoint.policy


def test_order_and_exactness_across_workers(manager, checkpoint):
    requests = mixed_requests(18)
    batch = manager.generate(requests)
    assert_same_tokens(batch.results, reference(current_policy_dir(manager, checkpoint), requests))
    assert {r.worker_id for r in batch.results} == {"worker-0", "worker-1"}
    for group in range(6):  # groups are not split across workers
        assert len({r.worker_id for r in batch.results if r.group == group}) == 1
    assert sum(t.requests for t in batch.workers) == 18 and batch.retried_requests == 0
    assert batch.rounds and {r.strategy for r in batch.rounds} == {"3_2_4"}
    assert all(
        t.busy_s + t.idle_s == pytest.approx(batch.workers[0].busy_s + batch.workers[0].idle_s) for t in batch.workers
    )
    assert 0.0 <= batch.tail_time_s <= batch.wall_time_s


def test_concurrent_requests_share_rounds(manager, checkpoint):
    actor = manager.workers[0].actor
    ray.get(actor.take_rounds.remote())
    params = [SamplingParams(max_new_tokens=32, temperature=1.0, seed=7 + i, ignore_eos=True) for i in range(6)]
    results = [None] * 6
    start = threading.Barrier(6)

    def call(i: int) -> None:
        start.wait()
        results[i] = ray.get(actor.generate.remote(prompt(i), params[i], f"c{i}"))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    requests = [RolloutRequest(f"c{i}", prompt(i), params[i]) for i in range(6)]
    assert_same_tokens(results, reference(current_policy_dir(manager, checkpoint), requests))
    rounds = ray.get(actor.take_rounds.remote())
    assert max(r.batch_size for r in rounds) > 1, "concurrent callers should share decode rounds"


def test_idle_worker_cotrains_during_the_tail(manager):
    manager.generate(mixed_requests(8, prefix="warm"))  # both workers hold hidden states now
    before = manager.drafter_version
    requests = tail_batch()
    batch = manager.generate(requests)
    assert [r.request_id for r in batch.results] == [r.request_id for r in requests]
    long_worker, short_worker = batch.results[0].worker_id, batch.results[-1].worker_id
    assert long_worker != short_worker
    timing = {t.worker_id: t for t in batch.workers}
    # a slice still in its step when the last result came back counts once the drafter round collects it (on a
    # loaded machine the tail can end before the idle worker's first step does)
    assert timing[short_worker].idle_s > 0 and timing[short_worker].cotrain_steps > 0
    assert sum(t.cotrain_steps for t in batch.workers) <= batch.drafter.steps  # counted once, among the round's
    assert timing[long_worker].cotrain_steps == 0
    assert batch.tail_time_s > 0 and batch.drafter.steps > 0 and batch.drafter.failures == []
    assert all(r.drafter_version == before for r in batch.results)
    assert batch.drafter_version == before + 1 == manager.drafter_version
    assert {s.drafter_version for s in manager.worker_stats()} == {before + 1}
    version, state = manager.drafter_state()
    assert version == before + 1 and state


def test_policy_push_is_versioned(manager, checkpoint):
    manager.update_policy(1, load_model(checkpoint.policy_v1).state_dict())
    assert [s.policy_version for s in manager.worker_stats()] == [1, 1]
    requests = mixed_requests(12, prefix="v1-")
    batch = manager.generate(requests)
    assert_same_tokens(batch.results, reference(checkpoint.policy_v1, requests))
    assert all(r.policy_version == 1 for r in batch.results)


def test_killed_worker_requests_are_rerun(manager, checkpoint):
    requests = [  # staggered lengths: results arrive one by one (of one length, a wave finished all at once, and the
        # kill could land after the victim's last result under a loaded machine); prompts no earlier test sent, so
        # that the prompt affinity (a prompt goes back to the worker that served it) does not leave the victim only
        # a few of them, all finished by the time the kill lands
        RolloutRequest(
            f"k{i}", prompt(100 + i), SamplingParams(max_new_tokens=16 + 2 * i, seed=300 + i, ignore_eos=True), group=i
        )
        for i in range(32)
    ]
    manager.generate(mixed_requests(8, prefix="fill"))  # every worker's buffer holds sequences at a round's end
    manager.finish_rollout()
    victim = manager.workers[1]
    stats = ray.get(victim.actor.stats.remote())
    served, buffered = stats.requests_served, stats.buffer_sequences  # its buffer as the last drafter round left it
    killed = threading.Event()

    def kill_in_second_wave() -> None:  # 16 requests per worker, 4 at a time: kill once 5 results are back
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stats = ray.get(victim.actor.stats.remote())  # with a few still running: on a loaded machine the victim
            if stats.requests_served >= served + 5 and stats.running_requests > 1:  # could finish one before it lands
                ray.kill(victim.actor)
                killed.set()
                return
            time.sleep(0.005)

    inject(victim.actor, slow_steps(0.02))  # a wide window for the kill, however loaded the machine (it raced)
    killer = threading.Thread(target=kill_in_second_wave)
    killer.start()
    batch = manager.generate(requests)
    killer.join()
    assert killed.is_set()
    assert_same_tokens(batch.results, reference(current_policy_dir(manager, checkpoint), requests))
    assert len({r.request_id for r in batch.results}) == 32
    kept = sum(r.worker_id == victim.worker_id for r in batch.results)
    assert batch.retried_requests >= 1 and kept >= 1, "results returned before the kill are kept, the rest re-run"
    assert {t.worker_id: t.requests for t in batch.workers}[victim.worker_id] == kept
    [lost] = batch.replacements  # the loss, as the trainer sees it
    assert (lost.worker_id, len(lost.rerun_request_ids)) == (victim.worker_id, batch.retried_requests)
    assert buffered > 0
    assert lost.cotrain_sequences_lost == buffered + kept, "its buffer died with it: what it held, what it served"
    # the dead worker was replaced by a fresh actor running the current versions
    assert manager.replaced_workers == 1 and len(manager.workers) == 2
    stats = manager.worker_stats()
    assert {s.policy_version for s in stats} == {manager.policy_version}
    assert {s.drafter_version for s in stats} == {manager.drafter_version}
    after = manager.generate(mixed_requests(6, prefix="after"))
    assert len(after.results) == 6 and after.retried_requests == 0


def test_history_indexes_are_saved_and_restored_per_worker_slot(checkpoint, ray_cluster):
    config = RolloutManagerConfig(worker=worker_config(checkpoint, strategy="3_2_4+suffix_8"), num_workers=2)
    mgr = RayRolloutManager(config)
    try:
        mgr.generate(mixed_requests(12, prefix="h"))
        states = mgr.history_state()
        assert len(states) == 2 and all(s is not None and s.num_tokens > 0 for s in states)
        assert states[0] != states[1]  # each worker served its own prompt groups
        mgr.load_history_state(states[::-1])
        assert mgr.history_state() == states[::-1]
        later = mixed_requests(6, prefix="h-after")
        assert_same_tokens(mgr.generate(later).results, reference(checkpoint.policy, later))
    finally:
        mgr.shutdown()


def test_a_checkpoint_of_more_worker_slots_is_folded_into_fewer_workers(checkpoint, ray_cluster):
    """A resume with fewer workers than the checkpoint's history slots restored the first slots and silently dropped
    the others: slot j now goes into slot j % n (its prompts' affinity too)."""
    from fastrl.speculative.history import HistoryState, merge_history_states

    slots = [
        HistoryState([([5, 6, 7], [[8, 9], [10]])]),
        HistoryState([([20, 21], [[22, 23, 24]])]),
        None,
        HistoryState([([30, 31], [[32]])]),
    ]
    config = RolloutManagerConfig(worker=worker_config(checkpoint, strategy="3_2_4+suffix_8"), num_workers=2)
    mgr = RayRolloutManager(config)
    try:
        state = mgr.selector_state() | {"affinity": [[[5, 6, 7], 0], [[20, 21], 1], [[30, 31], 3]]}
        mgr.load_selector_state(state)
        mgr.load_history_state(slots)
        assert mgr.history_state() == [merge_history_states([slots[0]]), merge_history_states([slots[1], slots[3]])]
        assert sum(s.num_tokens for s in mgr.history_state()) == sum(s.num_tokens for s in slots if s is not None)
        assert [mgr._affinity.home(p) for p in ((5, 6, 7), (20, 21), (30, 31))] == [0, 1, 1]
    finally:
        mgr.shutdown()


def test_more_prompt_groups_than_a_workers_call_threads_still_roll_out(checkpoint, ray_cluster):
    """A worker holds every part of its share, one call thread each, until all have arrived: with more prompt groups
    than its ``max_concurrent_calls`` the parts that found no thread never came and the rollout hung (65 groups a
    worker at the default 64: ``rl.prompts_per_step`` 130 on two workers). A worker's groups now go in at most
    that many calls, queued in the same order, so the tokens are the ones plain decoding gives."""
    worker = worker_config(checkpoint, max_concurrent_calls=2, cotrain=False)
    mgr = RayRolloutManager(RolloutManagerConfig(worker=worker, num_workers=1))
    try:
        requests = mixed_requests(10, group_size=2, prefix="many")  # five groups on one worker of two threads
        batch = mgr.generate(requests)
        assert_same_tokens(batch.results, reference(checkpoint.policy, requests))
        assert batch.retried_requests == 0
    finally:
        mgr.shutdown()
