"""Weight pushes the workers refuse, on a real local Ray with two workers: the manager records a policy version
only when every live worker installed it, so a refused push changes nothing (one ValueError), and workers started
later (replacements) start from the last accepted weights. A worker lost mid-push does not stop the push; a worker
whose start-up push raises is killed and replaced again."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable

import pytest
import ray
import torch
from ray.exceptions import GetTimeoutError, RaySystemError, RayTaskError
from torch import Tensor

from fastrl.models.checkpoint import load_model
from fastrl.rollout.manager import RayRolloutManager, is_refusal
from fastrl.rollout.manager_config import RolloutManagerConfig
from tests.rollout.conftest import assert_same_tokens, mixed_requests, reference, worker_config
from tests.rollout.faults import (
    dying_on,
    inject,
    inject_into_new_workers,
    raising_policy_pushes,
)

State = dict[str, Tensor]


def start_manager(checkpoint) -> RayRolloutManager:
    config = RolloutManagerConfig(worker=worker_config(checkpoint, cotrain=False), num_workers=2, round_timeout_s=10.0)
    return RayRolloutManager(config)


@pytest.fixture(scope="module")
def manager(checkpoint, ray_cluster):
    mgr = start_manager(checkpoint)
    yield mgr
    mgr.shutdown()


@pytest.fixture
def own_manager(checkpoint, ray_cluster):
    """A manager of the test's own (the test leaves it with fewer workers)."""
    mgr = start_manager(checkpoint)
    yield mgr
    mgr.shutdown()


@pytest.fixture(scope="module")
def states(checkpoint) -> dict[int, tuple[str, State]]:
    """Policy version -> (its directory, its weights): even versions are the checkpoint's v0 weights, odd ones v1."""
    v0, v1 = load_model(checkpoint.policy).state_dict(), load_model(checkpoint.policy_v1).state_dict()
    return {v: (checkpoint.policy_v1, v1) if v % 2 else (checkpoint.policy, v0) for v in range(8)}


def with_nan(state: State) -> State:
    name = next(k for k in state if k.endswith("norm.weight"))
    return dict(state, **{name: torch.full_like(state[name], float("nan"))})


def missing_tensor(state: State) -> State:
    return {k: v for k, v in state.items() if k != next(iter(state))}


def wrong_shape(state: State) -> State:
    name = next(k for k in state if k.endswith("norm.weight"))
    return dict(state, **{name: torch.ones(state[name].numel() + 1)})


def integer_tensor(state: State) -> State:
    name = next(k for k in state if k.endswith("norm.weight"))
    return dict(state, **{name: state[name].to(torch.int64)})


def serves(manager: RayRolloutManager, policy_dir: str, prefix: str) -> None:
    """A rollout on ``manager`` gives exactly what ``policy_dir``'s weights give."""
    requests = mixed_requests(6, prefix=prefix)
    assert_same_tokens(manager.generate(requests).results, reference(policy_dir, requests))


@pytest.mark.parametrize("spoil", [with_nan, missing_tensor, wrong_shape, integer_tensor])
def test_a_refused_policy_push_changes_nothing(manager, states, spoil: Callable[[State], State]):
    manager.update_policy(manager.policy_version + 1, states[manager.policy_version + 1][1])
    version = manager.policy_version
    pattern = rf"policy version {version + 1} refused by rollout worker worker-\d+ \(and 1 more\): ValueError: .*"
    with pytest.raises(ValueError, match=pattern + rf"every worker keeps policy version {version}$"):
        manager.update_policy(version + 1, spoil(states[version + 1][1]))
    assert manager.policy_version == version
    assert {s.policy_version for s in manager.worker_stats()} == {version}


def test_a_replacement_after_a_refused_push_starts_from_the_accepted_weights(manager, states):
    """The bug: the refused weights were stored and pushed to every later replacement, whose start-up then failed
    on every call (every later rollout raised)."""
    manager.update_policy(manager.policy_version + 1, states[manager.policy_version + 1][1])
    version = manager.policy_version
    with pytest.raises(ValueError, match="refused"):
        manager.update_policy(version + 1, with_nan(states[version + 1][1]))
    victim = manager.workers[0]
    os.kill(ray.get(victim.actor.pid.remote()), signal.SIGKILL)
    time.sleep(0.5)
    for attempt in range(2):
        serves(manager, states[version][0], f"after-refused-{attempt}")
    assert victim.worker_id not in {w.worker_id for w in manager.workers} and len(manager.workers) == 2
    assert {s.policy_version for s in manager.worker_stats()} == {version}


def test_a_push_refused_by_one_worker_is_refused_for_all(manager, states):
    """Worker 1 refuses, worker 0 installs the push: the push is refused as a whole, worker 0 is killed and replaced
    at the last accepted weights, and every worker serves the last accepted version."""
    version = manager.policy_version
    refuser, taker = manager.workers[1], manager.workers[0]
    inject(refuser.actor, raising_policy_pushes(ValueError("injected refusal")))
    pattern = rf"policy version {version + 1} refused by rollout worker {refuser.worker_id}: ValueError: injected"
    with pytest.raises(ValueError, match=pattern):
        manager.update_policy(version + 1, states[version + 1][1])
    assert manager.policy_version == version
    assert {s.policy_version for s in manager.worker_stats()} == {version}
    assert taker.worker_id not in {w.worker_id for w in manager.workers} and len(manager.workers) == 2
    batch = manager.generate(mixed_requests(6, prefix="after-split"))
    assert [(r.worker_id, "reverted" in r.reason) for r in batch.replacements] == [(taker.worker_id, True)]
    assert_same_tokens(batch.results, reference(states[version][0], mixed_requests(6, prefix="after-split")))
    ray.kill(refuser.actor)  # the refuser keeps refusing: the next test gets a fresh worker in its place


def test_a_push_stands_when_a_worker_dies_during_it(manager, states):
    """The workers that answered installed it: the version is recorded, and the lost worker's replacement starts
    from the new weights, so every worker ends on it."""
    version = manager.policy_version
    victim = manager.workers[0]
    inject(victim.actor, dying_on("update_policy"))
    manager.update_policy(version + 1, states[version + 1][1])
    assert manager.policy_version == version + 1
    assert victim.worker_id not in {w.worker_id for w in manager.workers}
    assert {s.policy_version for s in manager.worker_stats()} == {version + 1}
    serves(manager, states[version + 1][0], "after-died-mid-push")


def test_a_push_stands_when_a_worker_fails_it_past_its_checks(manager, states):
    """A RuntimeError inside the worker's push (an OOM or a failed copy in load_state_dict, after its checks, which
    may leave a partial copy) is no refusal: it used to refuse the push for all. The worker is killed and replaced,
    and the push stands on the other worker's answer; the replacement starts from the new weights."""
    version = manager.policy_version
    victim = manager.workers[0]
    inject(victim.actor, raising_policy_pushes(RuntimeError("injected load failure")))
    manager.update_policy(version + 1, states[version + 1][1])
    assert manager.policy_version == version + 1
    assert not victim.alive and "failed the policy push (RuntimeError: injected load failure)" in victim.lost_reason
    assert victim.worker_id not in {w.worker_id for w in manager.workers}
    assert {s.policy_version for s in manager.worker_stats()} == {version + 1}
    batch = manager.generate(mixed_requests(6, prefix="after-failed-push"))
    assert [r.worker_id for r in batch.replacements] == [victim.worker_id]
    assert_same_tokens(batch.results, reference(states[version + 1][0], mixed_requests(6, prefix="after-failed-push")))


def test_only_a_task_error_caused_by_a_value_error_is_a_refusal():
    def task_error(cause: BaseException) -> RayTaskError:
        return RayTaskError("update_policy", "Traceback ...", cause).as_instanceof_cause()

    assert is_refusal(task_error(ValueError("pushed weights: nan")))
    assert not is_refusal(task_error(RuntimeError("CUDA out of memory")))
    assert not is_refusal(task_error(MemoryError()))
    assert not is_refusal(RaySystemError("could not fetch the pushed object"))
    assert not is_refusal(GetTimeoutError("no answer"))


def test_a_replacement_whose_start_up_push_raises_is_killed(own_manager, states, monkeypatch, caplog):
    """Every replacement refuses its start-up policy push: each is killed (it used to stay, and every call raised
    its error again); after as many tries as there are slots the slot goes, and the other worker serves."""
    manager, version = own_manager, 1
    manager.update_policy(version, states[version][1])  # replacements start with this push
    inject_into_new_workers(monkeypatch, manager, raising_policy_pushes(ValueError("injected refusal")))
    victim, other = manager.workers
    os.kill(ray.get(victim.actor.pid.remote()), signal.SIGKILL)
    time.sleep(0.5)
    with caplog.at_level(logging.WARNING, logger="fastrl.rollout"):
        serves(manager, states[version][0], "after-failed-start")
    assert any("failed to start" in m and "injected refusal" in m for m in caplog.messages)
    assert [w.worker_id for w in manager.workers] == [other.worker_id]
