"""EngineWorker.generate interrupted (Ctrl-C) and retried: the worker is left as before the call, whatever else
lands while it drops the call's requests."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest

from fastrl.rollout.engine_worker import EngineWorker
from tests.rollout.conftest import assert_same_tokens, mixed_requests, reference, worker_config


def interrupt_at(worker: EngineWorker, steps: set[int]) -> Callable[[], None]:
    """Send SIGINT to this process in the engine's steps numbered ``steps`` (1-based, counted over every step from
    now, those ``Engine.drop`` runs included); returns the function that undoes the patch."""
    real, count = worker.engine.step, []

    def step():
        count.append(1)
        if len(count) in steps:
            os.kill(os.getpid(), signal.SIGINT)  # held to the step's end
        return real()

    worker.engine.step = step
    return lambda: setattr(worker.engine, "step", real)


def test_a_retried_generate_adds_each_requests_features_once(checkpoint):
    """Requests that finished before the interrupt had their features staged; the retry's commit added them a
    second time (13 buffer sequences where an uninterrupted run leaves 8)."""
    requests = mixed_requests(8, prefix="cut")
    clean = EngineWorker("clean", worker_config(checkpoint))
    clean.generate(requests)
    worker = EngineWorker("w0", worker_config(checkpoint))
    restore = interrupt_at(worker, {12})
    with pytest.raises(KeyboardInterrupt):
        worker.generate(requests)
    restore()
    assert worker.cotraining.pending == 0
    assert_same_tokens(worker.generate(requests), reference(checkpoint.policy, requests))
    assert worker.buffer.num_sequences == clean.buffer.num_sequences > 0


def test_a_second_interrupt_while_dropping_leaves_no_request_running(checkpoint):
    """The second Ctrl-C, held by Engine.drop and raised at its end, skipped the worker's cleanup: its delivered
    requests stayed in the worker's running set."""
    worker = EngineWorker("w0", worker_config(checkpoint, cotrain=False))
    requests = mixed_requests(8, prefix="cut")
    restore = interrupt_at(worker, {3, 4})  # the 4th step is the first one Engine.drop runs
    with pytest.raises(KeyboardInterrupt):
        worker.generate(requests)
    restore()
    assert not worker.has_unfinished() and worker.stats().running_requests == 0
    assert_same_tokens(worker.generate(requests), reference(checkpoint.policy, requests))


def test_an_interrupt_inside_submit_drops_the_request_it_queued(checkpoint):
    """Ctrl-C after the engine queued a request but before submit recorded it: the call dropped only the requests
    it had recorded, so that one ran on and a retry was refused ("already running")."""
    worker = EngineWorker("w0", worker_config(checkpoint, cotrain=False))
    requests = mixed_requests(4, prefix="cut")
    real, added = worker.engine.add_request, []

    def add_request(*args, **kwargs):
        request_id = real(*args, **kwargs)
        added.append(request_id)
        if len(added) == 3:
            raise KeyboardInterrupt  # as a signal between the engine's queueing and the worker's record
        return request_id

    worker.engine.add_request = add_request
    with pytest.raises(KeyboardInterrupt):
        worker.generate(requests)
    worker.engine.add_request = real
    assert not worker.has_unfinished() and worker.stats().running_requests == 0
    assert_same_tokens(worker.generate(requests), reference(checkpoint.policy, requests))
