"""``ray.shutdown()`` under a RayRolloutManager, on a real local Ray: every later call raises one clear RuntimeError
and none starts a fresh Ray (a Ray call used to start one silently, with a dashboard and not bound to loopback, and
then fail with "owner is unknown" or "Can't find actor")."""

from __future__ import annotations

import os

import pytest
import ray

from fastrl.rollout.cluster import ensure_ray
from fastrl.rollout.manager import RayRolloutManager
from fastrl.rollout.manager_config import RolloutManagerConfig
from tests.rollout.conftest import mixed_requests, worker_config

SHUT_DOWN = "Ray was shut down under the rollout manager"


@pytest.fixture
def manager(checkpoint, ray_cluster):
    """A manager on the package's Ray, which the test shuts down; a fresh local Ray is started for the tests after."""
    mgr = RayRolloutManager(RolloutManagerConfig(worker=worker_config(checkpoint, cotrain=False), num_workers=2))
    yield mgr
    mgr.shutdown()
    ensure_ray(None, min(2, os.cpu_count() or 1))


def test_ray_shut_down_under_the_manager_is_one_clear_error_and_starts_no_ray(manager):
    assert len(manager.generate(mixed_requests(4, prefix="before")).results) == 4
    ray.shutdown()
    calls = [
        lambda: manager.generate(mixed_requests(2, prefix="after")),
        lambda: manager.update_policy(1, {}),
        manager.worker_stats,
        manager.selector_state,
        manager.finish_rollout,
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match=SHUT_DOWN):
            call()
        assert not ray.is_initialized(), "a call started a fresh Ray"
    manager.shutdown()
    assert not ray.is_initialized()
