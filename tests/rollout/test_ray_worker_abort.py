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
