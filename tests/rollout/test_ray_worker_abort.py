"""RolloutWorkerActor.abort on a real local Ray: requests of a generate_batch part held for its share's other parts
are aborted too (they used to be missed, then run to their end once the share was complete), the share still goes
out when its last part comes, and one id given bare is refused (it was read as its characters: nothing aborted)."""

from __future__ import annotations

import time

import pytest
import ray

from fastrl.rollout.ray_worker import start_worker
from fastrl.rollout.types import RolloutRequest
from fastrl.sampling.params import SamplingParams
from tests.rollout.conftest import prompt, reference, worker_config


def _requests(prefix: str, n: int) -> list[RolloutRequest]:
    params = [SamplingParams(max_new_tokens=24, seed=700 + i, ignore_eos=True) for i in range(n)]
    return [RolloutRequest(f"{prefix}{i}", prompt(i), params[i], group=i) for i in range(n)]


@pytest.fixture(scope="module")
def worker(checkpoint, ray_cluster):
    actor = start_worker("abort-worker", worker_config(checkpoint, cotrain=False))
    ray.get(actor.stats.remote())
    yield actor
    ray.kill(actor, no_restart=True)


def test_abort_reaches_the_requests_of_a_held_share_part(worker, checkpoint):
    held, late = _requests("held", 2), _requests("late", 2)
    first = worker.generate_batch.remote(held, share=("s", 0, 2))
    deadline = time.monotonic() + 30
    aborted: list[str] = []
    while not aborted and time.monotonic() < deadline:  # until the part has reached the actor and is held
        aborted = ray.get(worker.abort.remote(None))
        time.sleep(0.02)
    assert sorted(aborted) == ["held0", "held1"]
    results = ray.get(first, timeout=60)
    assert [r.finish_reason for r in results] == ["abort", "abort"] and all(not r.token_ids for r in results)
    # the share's last part still goes out (alone now), and decodes as plain decoding does
    second = ray.get(worker.generate_batch.remote(late, share=("s", 1, 2)), timeout=60)
    expected = reference(checkpoint.policy, late)
    assert [r.token_ids for r in second] == [e.token_ids for e in expected]
    assert [r.finish_reason for r in second] == ["length", "length"]


def test_one_id_given_bare_is_refused(worker):
    with pytest.raises(ray.exceptions.RayTaskError, match="request_ids must be a list of ids or None, got str"):
        ray.get(worker.abort.remote("held0"))


def _wait_running(actor: ray.actor.ActorHandle) -> None:
    deadline = time.monotonic() + 30
    while ray.get(actor.stats.remote()).running_requests == 0 and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_policy_push_while_a_request_runs_is_refused_and_the_request_keeps_its_version(worker, checkpoint):
    """A push between two of a request's steps made its tokens come from two versions, and its result said the
    newer one. The worker refuses it while anything is unfinished; the request ends under the version it began with."""
    from fastrl.models.checkpoint import load_model

    [request] = _requests("push-mid", 1)
    request = RolloutRequest(
        request.request_id, request.prompt_ids, SamplingParams(max_new_tokens=400, seed=9, ignore_eos=True)
    )
    call = worker.generate_batch.remote([request])
    _wait_running(worker)
    state = load_model(checkpoint.policy_v1).state_dict()
    with pytest.raises(ray.exceptions.RayTaskError, match="policy version 1 refused: requests are unfinished"):
        ray.get(worker.update_policy.remote(1, state))
    [result] = ray.get(call, timeout=120)
    assert result.policy_version == 0
    assert result.token_ids == reference(checkpoint.policy, [request])[0].token_ids
    assert ray.get(worker.update_policy.remote(1, state)) == 1  # between rollouts it goes in
    ray.get(worker.update_policy.remote(0, load_model(checkpoint.policy).state_dict()))


def test_close_fails_the_calls_waiting_and_those_after_it(checkpoint, ray_cluster):
    """close() stopped the stepping loop and left the calls waiting for results, and any sent later, waiting for
    ever."""
    actor = start_worker("close-worker", worker_config(checkpoint, cotrain=False))
    try:
        params = SamplingParams(max_new_tokens=400, seed=3, ignore_eos=True)
        waiting = actor.generate_batch.remote([RolloutRequest("long", prompt(1), params)])
        _wait_running(actor)
        ray.get(actor.close.remote())
        with pytest.raises(ray.exceptions.RayTaskError, match="the worker was closed"):
            ray.get(waiting, timeout=30)
        with pytest.raises(ray.exceptions.RayTaskError, match="the worker was closed"):
            ray.get(actor.generate_batch.remote([RolloutRequest("later", prompt(2), params)]), timeout=30)
    finally:
        ray.kill(actor, no_restart=True)
