"""Faults on a real local Ray: a worker stopped (SIGSTOP) mid-rollout or between rollouts, a worker killed between
rollouts, more workers than CPUs, a bad drafter path; and the local Ray listening on loopback only."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import pytest
import ray

from fastrl.rollout.listeners import listeners, process_tree
from fastrl.rollout.manager import RayRolloutManager
from fastrl.rollout.manager_config import RolloutManagerConfig
from fastrl.rollout.types import RolloutRequest
from fastrl.sampling.params import SamplingParams
from tests.rollout.conftest import assert_same_tokens, mixed_requests, prompt, reference, worker_config
from tests.rollout.faults import dying_on, inject

DEADLINE_S = 4.0


@pytest.fixture(scope="module")
def manager(checkpoint, ray_cluster):
    config = RolloutManagerConfig(
        worker=worker_config(checkpoint, cotrain=False),
        num_workers=2,
        round_timeout_s=DEADLINE_S,
        liveness_interval_s=0.2,
    )
    mgr = RayRolloutManager(config)
    yield mgr
    mgr.shutdown()


def long_requests(prefix: str, first: int, n: int = 24) -> list[RolloutRequest]:
    """Requests of staggered lengths (24..116 tokens): a worker that has served two still has others running (of
    one length, a batch finished all at once, and a fault meant to land mid-rollout could find nothing to re-run).
    Prompts ``first`` .. ``first + n - 1``, none an earlier test sent: the prompt affinity routes a prompt back to
    the worker that served it, and could leave the victim too few requests for the fault to land mid-rollout."""
    params = [
        SamplingParams(max_new_tokens=24 + 4 * i, seed=500 + i, ignore_eos=True, temperature=1.0) for i in range(n)
    ]
    return [RolloutRequest(f"{prefix}{i}", prompt(first + i), params[i], group=i) for i in range(n)]


def test_worker_stopped_mid_rollout_is_killed_replaced_and_its_requests_rerun(manager, checkpoint, caplog):
    requests = long_requests("stop", first=300)
    victim = manager.workers[1]
    pid = ray.get(victim.actor.pid.remote())
    served = ray.get(victim.actor.stats.remote()).requests_served
    stopped = threading.Event()

    def stop_after_a_few() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not stopped.is_set():
            if ray.get(victim.actor.stats.remote()).requests_served >= served + 2:
                os.kill(pid, signal.SIGSTOP)
                stopped.set()
            time.sleep(0.005)

    before = manager.replaced_workers
    stopper = threading.Thread(target=stop_after_a_few)
    stopper.start()
    with caplog.at_level(logging.WARNING, logger="fastrl.rollout"):
        batch = manager.generate(requests)
    stopper.join()
    assert stopped.is_set()
    assert_same_tokens(batch.results, reference(checkpoint.policy, requests))
    assert len({r.request_id for r in batch.results}) == len(requests)  # each request exactly once
    assert batch.retried_requests >= 1
    assert any("is hung" in m and victim.worker_id in m for m in caplog.messages)
    assert manager.replaced_workers == before + 1 and len(manager.workers) == 2
    assert victim.worker_id not in {w.worker_id for w in manager.workers}
    after = mixed_requests(6, prefix="after-stop")
    assert_same_tokens(manager.generate(after).results, reference(checkpoint.policy, after))


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_worker_lost_between_rollouts_is_replaced_and_logged(manager, checkpoint, caplog, fault):
    victim = manager.workers[0]
    os.kill(ray.get(victim.actor.pid.remote()), getattr(signal, fault))
    before = manager.replaced_workers
    requests = mixed_requests(12, prefix=f"between-{fault}")
    with caplog.at_level(logging.WARNING, logger="fastrl.rollout"):
        batch = manager.generate(requests)
    assert_same_tokens(batch.results, reference(checkpoint.policy, requests))
    assert any("lost between rollouts" in m and victim.worker_id in m for m in caplog.messages)
    assert manager.replaced_workers == before + 1
    assert len({r.worker_id for r in batch.results}) == 2, "the replacement serves in the same rollout"
    state = manager.selector_state()
    assert len(state["workers"]) == 2
    served = {tuple(p) for p, _ in state["affinity"]}  # which worker served each group's prompt, as the rollout left it
    firsts = {r.group: tuple(r.prompt_ids) for r in reversed(requests)}  # a group is homed by its first prompt
    assert set(firsts.values()) <= served


def test_a_worker_lost_while_reporting_state_keeps_every_slot(manager):
    """Checkpoints take each worker's state by slot; a worker lost during that call is replaced and the replacement
    answers for its slot with the lost worker's last selector state. The answers of the workers after it used to
    move up one slot (and the lost slot's went missing), so a resume loaded them into the wrong workers."""
    manager.generate(mixed_requests(6, prefix="lost-reporting"))
    before = manager.selector_state()
    victim = manager.workers[0]
    inject(victim.actor, dying_on("selector_state"))
    assert manager.selector_state() == before
    assert victim.worker_id not in {w.worker_id for w in manager.workers}
    assert len(manager.workers) == 2
    batch = manager.generate(mixed_requests(4, prefix="after-lost-reporting"))
    assert [r.worker_id for r in batch.replacements] == [victim.worker_id]  # the next batch records the loss


def test_more_workers_than_cpus_is_a_clear_error(checkpoint, ray_cluster):
    cpus = int(ray.cluster_resources()["CPU"])
    config = RolloutManagerConfig(worker=worker_config(checkpoint, num_cpus=1.0), num_workers=cpus + 1)
    with pytest.raises(ValueError, match=rf"rollout.num_workers={cpus + 1} .* need {cpus + 1} CPUs"):
        RayRolloutManager(config)


def test_bad_drafter_path_is_named_before_any_worker_starts(checkpoint, ray_cluster, tmp_path):
    config = RolloutManagerConfig(worker=worker_config(checkpoint, drafter_dir=str(tmp_path / "nope")))
    with pytest.raises(ValueError, match="rollout.worker.drafter_dir: drafter directory .*nope does not exist"):
        RayRolloutManager(config)


def test_local_ray_listens_on_loopback_only(manager):
    assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {"127.0.0.1"}
    found = listeners(process_tree(os.getpid()))
    assert {f.process for f in found} >= {"gcs_server", "raylet"}, found
    public = [f for f in found if not f.loopback]
    assert public == [], f"listeners on non-loopback addresses: {public}"


def test_worker_killed_mid_rollout_is_replaced_within_the_rollout_and_recorded(manager, checkpoint):
    """kill -9 of a worker process mid-rollout: the replacement serves its re-run requests in the same rollout, and
    the batch records the loss as a typed WorkerReplacement."""
    requests = long_requests("kill9", first=400)
    victim = manager.workers[0]
    pid = ray.get(victim.actor.pid.remote())
    served = ray.get(victim.actor.stats.remote()).requests_served
    killed = threading.Event()

    def kill_after_a_few() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed.is_set():
            stats = ray.get(victim.actor.stats.remote())  # with some still running: on a loaded machine the
            if stats.requests_served >= served + 2 and stats.running_requests > 0:  # victim could finish them all
                os.kill(pid, signal.SIGKILL)
                killed.set()
            time.sleep(0.005)

    rollout = manager.rollouts
    killer = threading.Thread(target=kill_after_a_few)
    killer.start()
    batch = manager.generate(requests)
    killer.join()
    assert killed.is_set()
    assert_same_tokens(batch.results, reference(checkpoint.policy, requests))
    [lost] = batch.replacements
    assert lost.worker_id == victim.worker_id and lost.rollout == rollout and "died" in lost.reason
    assert lost.replacement_id in {w.worker_id for w in manager.workers}
    rerun = {r.request_id: r.worker_id for r in batch.results if r.request_id in lost.rerun_request_ids}
    assert len(rerun) == len(lost.rerun_request_ids) == batch.retried_requests >= 1
    assert lost.replacement_id in set(rerun.values()), "the replacement serves re-run requests in the same rollout"
    assert lost.cotrain_sequences_lost == 0  # this manager runs without co-training
    assert manager.generate(mixed_requests(4, prefix="after-kill9")).replacements == []


def test_a_worker_found_dead_by_any_call_is_replaced_not_dropped(manager, checkpoint):
    """A worker whose death a report call finds (not the health check before a rollout) is replaced by the next
    call; it used to be dropped, so two such losses left no worker."""
    victim = manager.workers[1]
    os.kill(ray.get(victim.actor.pid.remote()), signal.SIGKILL)
    time.sleep(0.5)
    assert len(manager.worker_stats()) == 1  # this call finds it dead
    assert len(manager.worker_stats()) == 2  # the next one has replaced it
    assert victim.worker_id not in {w.worker_id for w in manager.workers}
    requests = mixed_requests(4, prefix="after-found-dead")
    batch = manager.generate(requests)
    assert_same_tokens(batch.results, reference(checkpoint.policy, requests))
    assert [(r.worker_id, r.rerun_request_ids) for r in batch.replacements] == [(victim.worker_id, [])]
