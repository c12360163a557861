"""Fault injection into real rollout worker actors: ``actor.__ray_call__(fault)`` runs ``fault(actor)`` in the actor's
own process, where it replaces one method of the actor's EngineWorker. Each fault is built by a factory, so Ray
pickles it by value (the actor processes need not import the tests)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import ray

from fastrl.rollout.manager import RayRolloutManager
from fastrl.rollout.rollout_run import WorkerHandle

Fault = Callable[[Any], None]


def failing_steps(after: int) -> Fault:
    """The worker's engine step raises ``RuntimeError("injected step failure")`` after ``after`` good steps (its
    stepping loop then fails every waiting call)."""

    def inject(actor: Any) -> None:
        worker, count = actor._worker, [0]
        original = worker.step

        def step() -> list:
            count[0] += 1
            if count[0] > after:
                raise RuntimeError("injected step failure")
            return original()

        worker.step = step

    return inject


def slow_steps(seconds: float) -> Fault:
    """Every engine step of the worker takes ``seconds`` longer: its requests stay running long enough for a test to
    act while they do, however loaded the machine is."""

    def inject(actor: Any) -> None:
        import time

        worker = actor._worker
        original = worker.step

        def step() -> list:
            time.sleep(seconds)
            return original()

        worker.step = step

    return inject


def raising_policy_pushes(error: Exception) -> Fault:
    """The worker's every policy push raises ``error``: a ``ValueError`` refuses it, as the worker's weight checks
    would; another error fails it past the checks, as an OOM or a copy failing inside ``load_state_dict`` would."""

    def inject(actor: Any) -> None:
        def update_policy(version: int, state: dict) -> None:
            raise error

        actor._worker.update_policy = update_policy

    return inject


def dying_on(method: str) -> Fault:
    """The worker's process exits when a call of its EngineWorker's ``method`` reaches it (a worker lost mid-push,
    mid-report)."""

    def inject(actor: Any) -> None:
        def die(*args: object) -> None:
            os._exit(1)

        setattr(actor._worker, method, die)

    return inject


def inject(actor: ray.actor.ActorHandle, fault: Fault) -> None:
    """Install ``fault`` in a running worker actor (waits until it is in place)."""
    ray.get(actor.__ray_call__.remote(fault))


def inject_into_new_workers(monkeypatch: pytest.MonkeyPatch, manager: RayRolloutManager, fault: Fault) -> None:
    """Every worker ``manager`` starts from now on (replacements) gets ``fault`` before any other call reaches it;
    ``monkeypatch.undo()`` ends that."""
    spawn = manager._spawn

    def spawn_faulty(slot: int) -> WorkerHandle:
        handle = spawn(slot)
        inject(handle.actor, fault)
        return handle

    monkeypatch.setattr(manager, "_spawn", spawn_faulty)


def refusing_submits() -> Fault:
    """The worker refuses every request it is given (its checks raise ValueError), while it stays healthy."""

    def inject(actor: Any) -> None:
        def submit(request: Any) -> None:
            raise ValueError("injected refusal")

        actor._worker.submit = submit

    return inject
