"""A worker whose stepping loop fails mid-rollout (its engine step raises), on a real local Ray with two workers: it
is killed and replaced within the rollout, its unfinished requests re-run and every finished result is kept (seeded
requests: the same tokens); a failure that recurs on every worker ends the rollout with one clear error."""

from __future__ import annotations

import logging
import time

import pytest
import ray

from fastrl.rollout.manager import RayRolloutManager
from fastrl.rollout.manager_config import RolloutManagerConfig
from fastrl.rollout.types import RolloutRequest
from fastrl.sampling.params import SamplingParams
from tests.rollout.conftest import assert_same_tokens, mixed_requests, prompt, reference, worker_config
from tests.rollout.faults import failing_steps, inject, inject_into_new_workers, refusing_submits


@pytest.fixture(scope="module")
def manager(checkpoint, ray_cluster):
    config = RolloutManagerConfig(
        worker=worker_config(checkpoint, cotrain=False), num_workers=2, round_timeout_s=4.0, liveness_interval_s=0.2
    )
    mgr = RayRolloutManager(config)
    yield mgr
    mgr.shutdown()


def long_requests(prefix: str, n: int = 16) -> list[RolloutRequest]:
    params = [SamplingParams(max_new_tokens=40, seed=500 + i, ignore_eos=True) for i in range(n)]
    return [RolloutRequest(f"{prefix}{i}", prompt(i), params[i], group=i) for i in range(n)]


def test_a_worker_whose_stepping_loop_fails_is_replaced_and_its_requests_rerun(manager, checkpoint, caplog):
    """It used to abort the rollout (RayTaskError out of generate) and lose the other worker's results."""
    requests = long_requests("fail")
    victim = manager.workers[1]
    inject(victim.actor, failing_steps(after=30))
    with caplog.at_level(logging.WARNING, logger="fastrl.rollout"):
        batch = manager.generate(requests)
    assert_same_tokens(batch.results, reference(checkpoint.policy, requests))
    [lost] = batch.replacements
    assert lost.worker_id == victim.worker_id
    assert lost.reason.startswith("failed mid-rollout") and "injected step failure" in lost.reason
    assert lost.rerun_request_ids and batch.retried_requests == len(lost.rerun_request_ids)
    assert any("failed mid-rollout" in m and victim.worker_id in m for m in caplog.messages)
    assert victim.worker_id not in {w.worker_id for w in manager.workers} and len(manager.workers) == 2
    assert lost.replacement_id in {w.worker_id for w in manager.workers}
    after = mixed_requests(6, prefix="after-fail")
    assert_same_tokens(manager.generate(after).results, reference(checkpoint.policy, after))


def test_a_failure_on_every_worker_is_one_clear_error_and_the_manager_recovers(manager, checkpoint, monkeypatch):
    """Every worker and every replacement fails at its first step (a deterministic bug): the replacements are
    bounded (one per starting worker) and the rollout ends with one RuntimeError naming a worker and the cause."""
    for w in manager.workers:
        inject(w.actor, failing_steps(after=0))
    inject_into_new_workers(monkeypatch, manager, failing_steps(after=0))
    pattern = (
        r"rollout worker worker-\d+ failed mid-rollout \(stepping loop failed: RuntimeError: injected step failure\), "
        r"and no rollout worker is left to re-run its requests \(.* its 2 replacements too\)"
    )
    with pytest.raises(RuntimeError, match=pattern):
        manager.generate(mixed_requests(8, prefix="doomed"))
    monkeypatch.undo()  # the bug is fixed: the next rollout replaces every lost worker and serves
    requests = mixed_requests(8, prefix="recovered")
    batch = manager.generate(requests)
    assert_same_tokens(batch.results, reference(checkpoint.policy, requests))
    assert len(manager.workers) == 2


def test_a_rollout_that_raises_leaves_no_request_running(manager, checkpoint):
    """A worker that refuses its requests ends the rollout with an error; the other worker's requests went on
    decoding after it, into the next policy push (tokens of two versions in one result: the push is refused now
    while they run)."""
    from fastrl.models.checkpoint import load_model

    refuser, other = manager.workers
    inject(refuser.actor, refusing_submits())
    params = [SamplingParams(max_new_tokens=400, seed=900 + i, ignore_eos=True) for i in range(8)]
    requests = [RolloutRequest(f"refused{i}", prompt(300 + i), params[i], group=i) for i in range(8)]
    with pytest.raises(ValueError, match=r"injected refusal.*not queued.*\(refused by rollout worker worker-\d+\)"):
        manager.generate(requests)
    assert [s.running_requests for s in manager.worker_stats()] == [0, 0]
    manager.update_policy(1, load_model(checkpoint.policy_v1).state_dict())
    manager.update_policy(2, load_model(checkpoint.policy).state_dict())
    ray.kill(refuser.actor, no_restart=True)  # the fault stays with the actor: the next call replaces it


def test_without_restarts_a_loss_between_rollouts_is_reported_and_a_shut_down_manager_says_so(checkpoint, ray_cluster):
    """With restart_failed_workers=False a worker lost between rollouts left the pool unreported (replacements []:
    the step's workers_replaced stayed 0); calls after shutdown() blamed Ray or the workers."""
    config = RolloutManagerConfig(
        worker=worker_config(checkpoint, cotrain=False),
        num_workers=2,
        round_timeout_s=4.0,
        restart_failed_workers=False,
    )
    mgr = RayRolloutManager(config)
    try:
        mgr.generate(mixed_requests(4, prefix="before-loss"))
        victim = mgr.workers[1]
        ray.kill(victim.actor, no_restart=True)
        with pytest.raises(ray.exceptions.RayActorError):  # dead before the next rollout starts (a kill is async)
            for _ in range(100):
                ray.get(victim.actor.health.remote(), timeout=10)
                time.sleep(0.1)
        batch = mgr.generate(mixed_requests(4, prefix="after-loss"))
        assert [(r.worker_id, r.replacement_id) for r in batch.replacements] == [(victim.worker_id, None)]
        assert len(batch.results) == 4
        later = mgr.generate(mixed_requests(2, prefix="later"))
        assert later.replacements == [] and [w.worker_id for w in mgr.workers] == [mgr.workers[0].worker_id]
    finally:
        mgr.shutdown()
    with pytest.raises(RuntimeError, match="this RayRolloutManager was shut down"):
        mgr.generate(mixed_requests(2, prefix="closed"))


def test_workers_that_do_not_start_in_time_name_the_timeout(checkpoint, ray_cluster):
    """It said Ray's "Get timed out: some object(s) not ready." alone."""
    config = RolloutManagerConfig(
        worker=worker_config(checkpoint, cotrain=False), num_workers=1, worker_start_timeout_s=0.01
    )
    with pytest.raises(RuntimeError, match=r"failed to start within worker_start_timeout_s=0.01 s"):
        RayRolloutManager(config)


def bad_prompt_batch(prefix: str) -> tuple[list[RolloutRequest], RolloutRequest]:
    """Six good requests with one whose prompt holds a float in their middle (the hunter's batch)."""
    good = mixed_requests(6, prefix=prefix)
    bad = RolloutRequest(f"{prefix}-bad", [3, 4.5, 6], SamplingParams(max_new_tokens=4))
    return good[:3] + [bad] + good[3:], bad


def test_a_bad_request_is_refused_as_the_local_backend_refuses_it(manager, checkpoint):
    """It was a RuntimeError naming whichever ids' call failed first (a valid one, say); now the driver refuses it
    before any worker sees it, a ValueError in the local backend's (the engine's) words. Params of None are the
    defaults on both backends; params that are not a SamplingParams a ValueError naming the request."""
    from fastrl.rollout.local import LocalRollout

    batch, bad = bad_prompt_batch("drv")
    local = LocalRollout(worker_config(checkpoint, cotrain=False), cotrain_after_batch=False)
    with pytest.raises(ValueError) as local_error:
        local.generate(batch)
    with pytest.raises(ValueError) as ray_error:
        manager.generate(batch)
    assert (
        str(ray_error.value)
        == str(local_error.value)
        == "request 'drv-bad': prompt ids must be integers, got 4.5 (float)"
    )
    dict_params = [*batch[:3], RolloutRequest("drv-dict", [3, 4], {"max_new_tokens": 4})]
    for backend in (local, manager):
        with pytest.raises(ValueError, match=r"^request 'drv-dict': params must be a SamplingParams, got dict$"):
            backend.generate(dict_params)
        [result] = backend.generate([RolloutRequest(f"drv-none-{id(backend)}", [3, 4], None)]).results
        assert result.finish_reason != "error" and result.token_ids
    assert [s.running_requests for s in manager.worker_stats()] == [0, 0]


def test_a_request_a_worker_refuses_is_named_and_so_are_those_it_kept_out(manager, checkpoint, monkeypatch):
    """Past the driver's checks (turned off here), the worker refuses the request itself: each failed call of the
    share names it, and the requests after it (not queued because of it); the rollout raises that as a ValueError
    (the caller's bad input, not a worker fault: no worker is replaced), and the next rollout serves."""
    monkeypatch.setattr("fastrl.rollout.rollout_run.check_prompts", lambda requests: None, raising=False)
    batch, bad = bad_prompt_batch("wrk")
    workers = [w.worker_id for w in manager.workers]
    pattern = r"^request 'wrk-bad': prompt ids must be integers, got 4\.5 \(float\).*refused by rollout worker"
    with pytest.raises(ValueError, match=pattern):
        manager.generate(batch)
    assert [w.worker_id for w in manager.workers] == workers
    actor = manager.workers[0].actor
    direct = [RolloutRequest(f"{r.request_id}-d", r.prompt_ids, r.params) for r in (batch[0], bad, batch[4], batch[5])]
    with pytest.raises(ValueError, match=r"requests \['wrk3-d', 'wrk4-d'\] after request 'wrk-bad-d' were not queued"):
        ray.get(actor.generate_batch.remote(direct))
    after = mixed_requests(6, prefix="after-refused")
    assert_same_tokens(manager.generate(after).results, reference(checkpoint.policy, after))
