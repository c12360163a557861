"""The rollout worker as a Ray actor: a background stepping loop does continuous batching over every caller's
requests, so concurrent callers share decode rounds; weight pushes, reports and co-training slices are served on
their own concurrency groups while it runs."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future

import ray
from ray.exceptions import RayActorError
from torch import Tensor

from fastrl.cotrain.cotrainer import SliceMetrics, TrainedDrafter
from fastrl.engine.heap import settle_heap
from fastrl.rollout.engine_worker import EngineWorker, abort_ids
from fastrl.rollout.errors import short_error
from fastrl.rollout.rollout_run import WorkerHandle
from fastrl.rollout.types import RolloutRequest, RolloutResult, RoundRecord
from fastrl.rollout.worker_config import RolloutWorkerConfig
from fastrl.rollout.worker_cotrain import CotrainState, RoundReport
from fastrl.rollout.worker_stats import WorkerHealth, WorkerStats
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.history import HistoryState

CONTROL = "control"
TRAIN = "train"


@ray.remote(concurrency_groups={CONTROL: 4, TRAIN: 1})
class RolloutWorkerActor:
    """A threaded actor around an EngineWorker.

    Generation calls (``generate``, ``generate_batch``; default group, ``max_concurrent_calls`` threads) queue their
    requests and wait; one stepping thread runs the engine while any request is unfinished. ``train_drafter_slice``
    runs on the ``train`` group, everything else on ``control``. A failure of the stepping loop fails the waiting
    calls and every later one (``health().ok`` turns False).
    """

    def __init__(self, worker_id: str, config: RolloutWorkerConfig, worker_index: int = 0) -> None:
        self._worker = EngineWorker(worker_id, config, worker_index)
        settle_heap()  # this process holds the engine for its life: start-up's objects out of the collector's way
        self._cond = threading.Condition()
        self._waiting: dict[str, Future[RolloutResult]] = {}
        self._held: dict[str, dict[int, list[tuple[RolloutRequest, Future[RolloutResult]]]]] = {}
        self._error: str | None = None
        self._stop_below = 0
        self._closed = False
        self._progress_at = time.monotonic()
        self._loop = threading.Thread(target=self._run, name=f"{worker_id}-stepper", daemon=True)
        self._loop.start()

    # ---- generation (default concurrency group) ---------------------------------------------------------------
    def generate_batch(
        self, requests: list[RolloutRequest], share: tuple[str, int, int] | None = None
    ) -> list[RolloutResult]:
        """Generate ``requests`` (sharing rounds with every other caller); results in request order.

        ``share = (key, index, count)``: this call is part ``index`` of ``count`` calls that together make one
        caller's share of a batch; the parts are held until all have arrived, then queued at once in part order
        (before the stepping loop runs again), so which requests share decode rounds does not depend on the order
        the calls arrived in. Each call still returns its own part as soon as it is done."""
        futures: list[Future[RolloutResult]] = [Future() for _ in requests]
        with self._cond:
            if share is None:
                self._submit_all(list(zip(requests, futures, strict=True)))
            else:
                key, index, count = share
                parts = self._held.setdefault(key, {})
                parts[index] = list(zip(requests, futures, strict=True))
                if len(parts) == count:
                    del self._held[key]
                    self._submit_all([item for i in range(count) for item in parts[i]])
        return [f.result() for f in futures]

    def _submit_all(self, items: list[tuple[RolloutRequest, Future[RolloutResult]]]) -> None:
        """Queue every request (under the lock). A refused one fails its own future and those after it, which are
        not queued: a ValueError (a request the checks refuse) is said once for all of them, naming the refused
        request and those left out (``not_queued``); another error (the worker failed earlier) fails them as is."""
        for n, (request, future) in enumerate(items):
            try:
                self._submit(request, future)
            except (RuntimeError, ValueError) as err:
                rest = items[n:]
                if isinstance(err, ValueError):
                    err = not_queued(err, request.request_id, [r.request_id for r, _ in rest[1:]])
                for _, later in rest:
                    later.set_exception(err)
                return

    def generate(
        self, prompt_ids: list[int], sampling_params: SamplingParams | None = None, request_id: str | None = None
    ) -> RolloutResult:
        """Generate one request; concurrent calls are batched together."""
        request = RolloutRequest(request_id or uuid.uuid4().hex, list(prompt_ids), sampling_params or SamplingParams())
        return self._submit(request, Future()).result()

    def _submit(self, request: RolloutRequest, future: Future[RolloutResult]) -> Future[RolloutResult]:
        with self._cond:
            if self._error is not None:
                raise RuntimeError(f"worker {self._worker.worker_id} failed earlier: {self._error}")
            if request.request_id in self._waiting:
                raise ValueError(f"request id {request.request_id!r} is already running on this worker")
            if not self._waiting:
                self._progress_at = time.monotonic()
            self._worker.submit(request)
            self._waiting[request.request_id] = future
            self._cond.notify()
        return future

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._worker.can_step():
                    self._cond.wait()  # requests queued while the memory is released wait for `restore_memory`
                if self._closed:
                    return
            try:
                finished = self._worker.step()
            except BaseException as err:  # the engine is in an unknown state: fail every caller, serve no more
                self._fail(f"{type(err).__name__}: {err}")
                return
            with self._cond:
                self._progress_at = time.monotonic()
                futures = [(self._waiting.pop(r.request_id), r) for r in finished]
            for future, result in futures:
                future.set_result(result)

    def _fail(self, error: str) -> None:
        with self._cond:
            self._error = error
            waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            future.set_exception(RuntimeError(f"worker {self._worker.worker_id}: stepping loop failed: {error}"))

    @ray.method(concurrency_group=CONTROL)
    def abort(self, request_ids: list[str] | None = None) -> list[str]:
        """Abort ``request_ids`` (None: every request queued or running here, those of a ``generate_batch`` part
        held for its other parts included): their calls return at the next step with the tokens generated so far
        and finish reason ``abort``. Returns the ids aborted."""
        ids = abort_ids(request_ids)
        with self._cond:
            self._submit_all(self._take_held(ids))  # queued now, to end through the engine as the others
            aborted = self._worker.abort(ids)
            self._cond.notify()
        return aborted

    def _take_held(self, request_ids: list[str] | None) -> list[tuple[RolloutRequest, Future[RolloutResult]]]:
        """Take ``request_ids`` (None: all) out of the held parts of shares (under the lock); their parts stay,
        so a share still goes out when its last part arrives."""
        wanted = None if request_ids is None else set(request_ids)
        taken = []
        for parts in self._held.values():
            for index, items in parts.items():
                hit = [wanted is None or request.request_id in wanted for request, _ in items]
                taken += [item for item, h in zip(items, hit, strict=True) if h]
                parts[index] = [item for item, h in zip(items, hit, strict=True) if not h]
        return taken

    # ---- device memory between rollouts (control group) ---------------------------------------------------------
    @ray.method(concurrency_group=CONTROL)
    def release_memory(self, parts: list[str]) -> int:
        """Give back the engine's device memory of ``parts`` (``"kv_cache"``, ``"weights"``) while no request is
        unfinished (ValueError otherwise); requests queued afterwards wait for ``restore_memory``. Returns the device
        bytes given back."""
        return self._worker.release_memory(parts)

    @ray.method(concurrency_group=CONTROL)
    def restore_memory(self, parts: list[str]) -> None:
        """Bring back the released ``parts``; the stepping loop runs again once nothing is released."""
        self._worker.restore_memory(parts)
        with self._cond:
            self._cond.notify()

    # ---- weights (control group) ------------------------------------------------------------------------------
    @ray.method(concurrency_group=CONTROL)
    def update_policy(self, version: int, state: dict[str, Tensor]) -> int:
        """Install policy weights as ``version`` (between engine steps); returns the version."""
        self._worker.update_policy(version, state)
        return version

    @ray.method(concurrency_group=CONTROL)
    def update_drafter(self, version: int, state: dict[str, Tensor]) -> int:
        """Install drafter weights as ``version``; returns the version."""
        self._worker.update_drafter(version, state)
        return version

    @ray.method(concurrency_group=CONTROL)
    def drafter_state(self) -> tuple[int, dict[str, Tensor]]:
        return self._worker.drafter_state()

    @ray.method(concurrency_group=CONTROL)
    def selector_state(self) -> dict:
        return self._worker.selector_state()

    @ray.method(concurrency_group=CONTROL)
    def load_selector_state(self, state: dict) -> None:
        self._worker.load_selector_state(state)

    # ---- reports (control group) ------------------------------------------------------------------------------
    @ray.method(concurrency_group=CONTROL)
    def stats(self) -> WorkerStats:
        return self._worker.stats()

    @ray.method(concurrency_group=CONTROL)
    def health(self) -> WorkerHealth:
        with self._cond:
            error = self._error if self._loop.is_alive() or self._error else "stepping loop is not running"
            stalled = time.monotonic() - self._progress_at if self._waiting else 0.0
        return self._worker.health(error, stalled)

    @ray.method(concurrency_group=CONTROL)
    def pid(self) -> int:
        """The actor's process id (for fault injection and diagnostics)."""
        return os.getpid()

    @ray.method(concurrency_group=CONTROL)
    def take_rounds(self) -> list[RoundRecord]:
        """Decode rounds recorded since the last call."""
        return self._worker.take_rounds()

    # ---- co-training ------------------------------------------------------------------------------------------
    @ray.method(concurrency_group=TRAIN)
    def train_drafter_slice(self, seconds: float, slice_id: int | None = None) -> SliceMetrics:
        """Co-train for up to ``seconds``; ``stop_training(i)`` ends slices with id <= i early. Never raises."""
        return self._worker.train_drafter_slice(seconds, lambda: slice_id is not None and slice_id < self._stop_below)

    @ray.method(concurrency_group=CONTROL)
    def stop_training(self, slice_id: int) -> None:
        """End the running slice (and any queued one) whose id is <= ``slice_id`` at its next step."""
        self._stop_below = max(self._stop_below, slice_id + 1)

    @ray.method(concurrency_group=CONTROL)
    def trained_drafter(self) -> TrainedDrafter | None:
        return self._worker.trained_drafter()

    @ray.method(concurrency_group=TRAIN)
    def finish_drafter_round(self) -> RoundReport:
        """Take the updates still due this rollout and report its co-training (EngineWorker.finish_drafter_round)."""
        return self._worker.finish_drafter_round()

    @ray.method(concurrency_group=CONTROL)
    def heldout_top1(self) -> tuple[int, float]:
        return self._worker.heldout_top1()

    @ray.method(concurrency_group=CONTROL)
    def history_state(self) -> HistoryState | None:
        return self._worker.history_state()

    @ray.method(concurrency_group=CONTROL)
    def load_history_state(self, state: HistoryState) -> None:
        self._worker.load_history_state(state)

    @ray.method(concurrency_group=CONTROL)
    def cotrain_state(self) -> CotrainState | None:
        return self._worker.cotrain_state()

    @ray.method(concurrency_group=CONTROL)
    def load_cotrain_state(self, state: CotrainState) -> None:
        self._worker.load_cotrain_state(state)

    @ray.method(concurrency_group=CONTROL)
    def close(self) -> None:
        """Stop the stepping loop (before the actor is killed): the calls waiting for results, and any sent later,
        fail with an error saying so."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._fail("the worker was closed")


def not_queued(refusal: ValueError, refused_id: str, later_ids: list[str]) -> ValueError:
    """``refusal`` of request ``refused_id`` with the requests after it in the same submission, left out because of
    it, named too (``refusal`` itself when there are none: the checks' messages name their request)."""
    if not later_ids:
        return refusal
    return ValueError(f"{refusal}; requests {later_ids} after request {refused_id!r} were not queued because of it")


def start_worker(worker_id: str, config: RolloutWorkerConfig, worker_index: int = 0) -> ray.actor.ActorHandle:
    """Start a worker actor in slot ``worker_index`` with the resources its config asks for (returns at once; the
    actor loads its models in the background, and calls queue until it is ready)."""
    return RolloutWorkerActor.options(
        num_cpus=config.num_cpus,
        num_gpus=config.num_gpus,
        max_concurrency=config.max_concurrent_calls,
        name=None,
    ).remote(worker_id, config, worker_index)


def await_started(
    workers: list[WorkerHandle], spawn: Callable[[int], WorkerHandle], timeout_s: float, log: logging.Logger
) -> WorkerStats:
    """Wait up to ``timeout_s`` for every worker to load its models; workers lost while starting (killed, crashed)
    are replaced in place by ``spawn(slot)`` once. Returns the first worker's stats; a second loss raises its error."""
    for attempt in range(2):
        refs = [w.actor.stats.remote() for w in workers]
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        stats: list[WorkerStats] = []
        lost = []
        for i, ref in enumerate(refs):
            try:
                stats.append(ray.get(ref, timeout=0))
            except RayActorError as err:
                if attempt:
                    raise
                log.warning("rollout worker %s was lost while starting: %s", workers[i].worker_id, short_error(err))
                lost.append(i)
        if not lost:
            return stats[0]
        for i in lost:
            ray.kill(workers[i].actor, no_restart=True)
            workers[i] = spawn(workers[i].slot)
    raise AssertionError("unreachable")
