"""One rollout over a set of worker actors: dispatch, gather in request order, re-run the work of workers that die,
and give workers whose share is done co-training slices until the tail ends."""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import ray
from ray.exceptions import RayActorError, RayError

from fastrl.cotrain.cotrainer import SliceMetrics
from fastrl.rollout.dispatch import PromptAffinity, WorkUnit, assign_units, check_prompts, make_units, merge_units
from fastrl.rollout.errors import short_error
from fastrl.rollout.liveness import LivenessMonitor, LivenessPolicy, probe
from fastrl.rollout.types import RolloutRequest, RolloutResult, WorkerTiming


@dataclass(eq=False)
class WorkerHandle:
    """A worker actor as the manager tracks it; ``ready`` holds calls (weight pushes to a replacement) that must
    finish before it serves; ``slot`` is its position (a replacement takes its predecessor's)."""

    worker_id: str
    actor: ray.actor.ActorHandle
    alive: bool = True
    ready: list[ray.ObjectRef] = field(default_factory=list)
    slot: int = 0
    lost_reason: str = ""  # once lost: why, the request ids re-run elsewhere, results it had returned
    rerun_request_ids: list[str] = field(default_factory=list)
    served_before_loss: int = 0
    buffered_sequences: int = 0  # its co-training buffer's sequences at the last drafter round's end
    loss_recorded: bool = False  # its loss is in a RolloutBatch's replacements (recorded once)


def adopt_replacements(workers: list[WorkerHandle], run_workers: list[WorkerHandle]) -> list[WorkerHandle]:
    """``workers`` (one per slot, in slot order) with each live replacement a rollout started (``run_workers`` not
    among them) in the entry of the slot it serves. A replacement that died in the same rollout is left out (its
    loss is recorded; the slot's dead entry is replaced after the rollout): taken in creation order into whichever
    entry was dead, it made a slot hold two workers, or put two slots' workers in each other's place, and
    checkpoints are written by entry."""
    adopted = list(workers)
    for fresh in run_workers:
        if fresh in adopted or not fresh.alive:
            continue
        entry = next((i for i, w in enumerate(adopted) if w.slot == fresh.slot), None)
        if entry is None:
            adopted.append(fresh)
        else:
            adopted[entry] = fresh
    return adopted


@dataclass
class RunOutcome:
    """Results in request order and how the rollout went (times in seconds from its start). ``slices``: the
    co-training slices that ended within the rollout; ``running_slices``: those still in a training step when the
    last result came back (told to stop at its end; the backend collects them with the rollout's drafter round)."""

    results: list[RolloutResult]
    generation_s: float
    tail_time_s: float
    timings: list[WorkerTiming]
    slices: list[tuple[str, SliceMetrics]]
    retried_requests: int
    running_slices: list[tuple[WorkerHandle, ray.ObjectRef]] = field(default_factory=list)


class RolloutRun:
    """Runs one batch on ``workers`` (all alive): a worker queues all units of its share of the dispatch plan
    together (``generate_batch``'s ``share``), so which requests share its decode rounds does not depend on timing,
    while each unit still returns on its own (kept if the worker dies later). Idle detection: a worker is idle once
    every unit sent to it has returned; while other workers still run (the tail) an idle worker is kept training in
    back-to-back slices of ``slice_seconds``; when the last unit returns every running slice is told to stop at its
    next step.

    A worker that dies, hangs (past ``liveness``'s per-round deadline) or fails (its stepping loop raised: its calls
    fail) is killed and replaced at once by ``replace`` (at most one replacement per starting worker; it serves on
    return); its unreturned units go to the least loaded of the survivors and the replacement; results count when a
    call returns (none lost or counted twice). Losses are bounded: once the replacements are spent every loss leaves
    one worker fewer, so a failure that recurs on every worker (a deterministic bug) ends the rollout with one
    RuntimeError naming the last worker lost and its cause.
    """

    def __init__(
        self,
        requests: list[RolloutRequest],
        workers: list[WorkerHandle],
        cotrain: bool,
        slice_seconds: float,
        slice_ids: Iterator[int],
        liveness: LivenessPolicy,
        replace: Callable[[WorkerHandle], WorkerHandle | None],
        log: logging.Logger,
        max_calls: int,
        affinity: PromptAffinity | None = None,
    ) -> None:
        self.requests = requests
        self.max_calls = max_calls  # each worker's generation threads (``max_concurrent_calls``)
        self.workers = list(workers)
        self.liveness = LivenessMonitor(liveness)
        self.replace = replace
        self.log = log
        self.cotrain = cotrain
        self.affinity = affinity
        self.slice_seconds = slice_seconds
        self.slice_ids = slice_ids
        self.results: list[RolloutResult | None] = [None] * len(requests)
        self.gen_refs: dict[ray.ObjectRef, tuple[WorkerHandle, WorkUnit]] = {}
        self.slice_refs: dict[ray.ObjectRef, tuple[WorkerHandle, int]] = {}
        self.load: dict[str, float] = {w.worker_id: 0.0 for w in workers}
        self.outstanding: Counter[str] = Counter()
        self.served: Counter[str] = Counter()
        self.busy_s: dict[str, float] = {}
        self.idle: set[str] = set()
        self.no_slices: set[str] = set()
        self.last_slice: dict[str, int] = {}
        self.slices: list[tuple[str, SliceMetrics]] = []
        self.retried = 0
        self.replacements_left = len(workers)
        self.replacements_used: list[str] = []
        self.first_idle: float | None = None
        self.start = 0.0

    def run(self) -> RunOutcome:
        """Dispatch, gather and re-run as the class says; a request whose prompt the engine would refuse is a
        ValueError naming it before any worker sees the batch (``check_prompts``)."""
        check_prompts(self.requests)
        self.start = time.perf_counter()
        units = make_units(self.requests, len(self.workers))
        homes = {}
        if self.affinity is not None:
            by_slot = {w.slot: w.worker_id for w in self.workers}
            homes = {u.prompt: by_slot[s] for u in units if (s := self.affinity.home(u.prompt)) in by_slot}
        plan = assign_units(units, self.load, homes)
        if self.affinity is not None:
            slot_of = {w.worker_id: w.slot for w in self.workers}
            for worker_id, unit in plan:
                self.affinity.record(unit.prompt, slot_of[worker_id])
        key = uuid.uuid4().hex
        for w in self.workers:  # a worker queues its units together, in plan order, once all have arrived
            units = [unit for worker_id, unit in plan if worker_id == w.worker_id]
            units = merge_units(units, max(1, self.max_calls - 1))  # a thread each while they wait, one to spare
            for index, unit in enumerate(units):
                self._send(w, unit, retry=False, share=(key, index, len(units)))
        for w in self.workers:
            if not self.outstanding[w.worker_id]:
                self._went_idle(w)
        interval = self.liveness.policy.check_interval_s
        while self.gen_refs:
            require_ray()
            ready, _ = ray.wait([*self.gen_refs, *self.slice_refs], num_returns=1, timeout=interval)
            require_ray()
            for ref in ready:
                if ref in self.gen_refs:
                    self._unit_done(ref)
                elif ref in self.slice_refs:
                    self._slice_done(ref)
            self._check_liveness()
        end = self._now()
        running = self._end_slices()
        missing = [self.requests[i].request_id for i, r in enumerate(self.results) if r is None]
        if missing:
            raise RuntimeError(f"rollout finished without results for {missing}")
        return RunOutcome(
            results=[r for r in self.results if r is not None],
            generation_s=end,
            tail_time_s=end - self.first_idle if self.first_idle is not None else 0.0,
            timings=self._timings(end),
            slices=self.slices,
            retried_requests=self.retried,
            running_slices=running,
        )

    # ---- generation -------------------------------------------------------------------------------------------
    def _send(
        self, worker: WorkerHandle, unit: WorkUnit, retry: bool, share: tuple[str, int, int] | None = None
    ) -> None:
        wid = worker.worker_id
        ref = worker.actor.generate_batch.remote([self.requests[i] for i in unit.indices], share)
        self.gen_refs[ref] = (worker, unit)
        self.outstanding[wid] += 1
        if retry:
            self.load[wid] += unit.work
            self.retried += len(unit.indices)
        if wid in self.idle:  # busy again: end its co-training
            self.idle.discard(wid)
            if wid in self.last_slice:
                worker.actor.stop_training.remote(self.last_slice[wid])

    def _unit_done(self, ref: ray.ObjectRef) -> None:
        worker, unit = self.gen_refs.pop(ref)
        try:
            outputs = ray.get(ref)
        except RayActorError:
            self.log.warning("rollout worker %s died mid-rollout; its unfinished requests re-run", worker.worker_id)
            self._lost(worker, [unit], "died mid-rollout")
            return
        except RayError as err:  # the call raised on a worker that still runs
            self._call_failed(worker, unit, err)
            return
        self._record(worker, unit, outputs)
        if not self.outstanding[worker.worker_id]:
            self._went_idle(worker)

    def _call_failed(self, worker: WorkerHandle, unit: WorkUnit, err: RayError) -> None:
        """A generation call raised. A worker that cannot serve by now (its stepping loop failed, or it died or does
        not answer a health check) is killed and replaced, and its unfinished requests re-run; a healthy worker
        refused the requests themselves, which no re-run mends: ``refusal_error``."""
        wid = worker.worker_id
        problem = probe({wid: worker.actor}, self.liveness.policy.round_timeout_s).get(wid)
        if problem is None:
            raise refusal_error(wid, [self.requests[i].request_id for i in unit.indices], err) from err
        self.log.warning("rollout worker %s failed mid-rollout (%s): killed; its requests re-run", wid, problem)
        ray.kill(worker.actor, no_restart=True)
        self._lost(worker, [unit], f"failed mid-rollout ({problem})")

    def _record(self, worker: WorkerHandle, unit: WorkUnit, outputs: list[RolloutResult]) -> None:
        wid = worker.worker_id
        for i, result in zip(unit.indices, outputs, strict=True):
            self.results[i] = result
        self.served[wid] += len(outputs)
        self.outstanding[wid] -= 1
        self.load[wid] -= unit.work

    def _check_liveness(self) -> None:
        """Kill the busy workers past the per-round deadline; their work goes elsewhere."""
        by_id = {w.worker_id: w for w in self.workers if w.alive}
        busy = {wid: w.actor for wid, w in by_id.items() if self.outstanding[wid]}
        for verdict in self.liveness.poll(busy):
            worker = by_id[verdict.worker_id]
            state = "is hung" if verdict.hung else "failed"
            self.log.warning(
                "rollout worker %s %s (%s): killed; its requests re-run", worker.worker_id, state, verdict.reason
            )
            ray.kill(worker.actor, no_restart=True)
            self._lost(worker, [], f"{'hung' if verdict.hung else 'failed'} mid-rollout ({verdict.reason})")

    def _end_slices(self) -> list[tuple[WorkerHandle, ray.ObjectRef]]:
        """Tell running slices to stop at the end of their training step, and hand them over without waiting: a
        drafter step takes seconds on a CPU, and the rollout's results must not wait for one (its updates belong to
        the drafter round, which overlaps the policy update; a slice that never ends is killed there as hung)."""
        running = list(self.slice_refs.items())
        for _, (w, sid) in running:
            w.actor.stop_training.remote(sid)
        self.slice_refs.clear()
        return [(w, ref) for ref, (w, _) in running]

    def _lost(self, worker: WorkerHandle, units: list[WorkUnit], reason: str) -> None:
        """``worker`` was lost (died, or killed as hung or failed): keep what it returned, replace it, re-send the rest
        to the survivors and the replacement; RuntimeError when none is left to take it."""
        worker.alive = False
        self.liveness.forget(worker.worker_id)
        wid = worker.worker_id
        self.busy_s.setdefault(wid, self._now())
        self.idle.discard(wid)
        theirs = [ref for ref, (w, _) in self.gen_refs.items() if w is worker]
        done, _ = ray.wait(theirs, num_returns=len(theirs), timeout=0) if theirs else ([], [])
        for ref in theirs:
            _, unit = self.gen_refs.pop(ref)
            outputs = _get_or_none(ref) if ref in done else None
            if outputs is None:
                units.append(unit)
            else:
                self._record(worker, unit, outputs)
        for ref in [r for r, (w, _) in self.slice_refs.items() if w is worker]:
            del self.slice_refs[ref]
        self.outstanding[wid] = 0
        self.load[wid] = 0.0
        worker.lost_reason, worker.served_before_loss = reason, self.served[wid]
        worker.rerun_request_ids = [self.requests[i].request_id for u in units for i in u.indices]
        survivors = [w for w in self.workers if w.alive]
        fresh = self.replace(worker) if self.replacements_left > 0 else None
        if fresh is not None:
            self.replacements_left -= 1
            self.replacements_used.append(fresh.worker_id)
            self.workers.append(fresh)
            self.load[fresh.worker_id] = 0.0
            survivors.append(fresh)
        if units and not survivors:
            raise RuntimeError(
                f"rollout worker {wid} {reason}, and no rollout worker is left to re-run its requests (every worker "
                f"of this rollout was lost, and its {len(self.replacements_used)} replacements too): the rollout "
                "cannot finish"
            )
        for unit in sorted(units, key=lambda u: -u.work):
            target = min(survivors, key=lambda w: self.load[w.worker_id])
            self._send(target, unit, retry=True)

    # ---- co-training in the tail ------------------------------------------------------------------------------
    def _went_idle(self, worker: WorkerHandle) -> None:
        now = self._now()
        self.idle.add(worker.worker_id)
        self.busy_s[worker.worker_id] = now
        if self.first_idle is None:
            self.first_idle = now
        self._maybe_train(worker)

    def _maybe_train(self, worker: WorkerHandle) -> None:
        wid = worker.worker_id
        running = any(w is worker for w, _ in self.slice_refs.values())
        if self.cotrain and self.gen_refs and worker.alive and wid in self.idle and wid not in self.no_slices:
            if not running:
                sid = next(self.slice_ids)
                self.last_slice[wid] = sid
                self.slice_refs[worker.actor.train_drafter_slice.remote(self.slice_seconds, sid)] = (worker, sid)

    def _slice_done(self, ref: ray.ObjectRef) -> None:
        worker, _ = self.slice_refs.pop(ref)
        try:
            metrics: SliceMetrics = ray.get(ref)
        except RayActorError:
            if worker.alive:
                self._lost(worker, [], "died during a co-training slice")
            return
        except RayError as err:
            metrics = SliceMetrics(error=f"{type(err).__name__}: {err}")
        self.slices.append((worker.worker_id, metrics))
        if metrics.error is not None or metrics.skipped is not None:
            self.no_slices.add(worker.worker_id)  # failing or nothing to learn from: no more slices this rollout
            return
        self._maybe_train(worker)

    # ---- telemetry --------------------------------------------------------------------------------------------
    def _timings(self, end: float) -> list[WorkerTiming]:
        timings = []
        for w in self.workers:
            wid = w.worker_id
            busy = min(self.busy_s.get(wid, end), end)
            timings.append(WorkerTiming(wid, self.served[wid], busy, end - busy))
        return count_slices(timings, self.slices)

    def _now(self) -> float:
        return time.perf_counter() - self.start


def count_slices(timings: list[WorkerTiming], slices: list[tuple[str, SliceMetrics]]) -> list[WorkerTiming]:
    """``timings`` with each slice's seconds and steps (none for a slice that failed) added to its worker's
    co-training; a slice of a worker not in ``timings`` is left out."""
    seconds: defaultdict[str, float] = defaultdict(float)
    steps: Counter[str] = Counter()
    for wid, m in slices:
        seconds[wid] += m.seconds
        steps[wid] += m.steps if m.error is None else 0
    return [
        replace(t, cotrain_s=t.cotrain_s + seconds[t.worker_id], cotrain_steps=t.cotrain_steps + steps[t.worker_id])
        for t in timings
    ]


def refusal_error(worker_id: str, request_ids: list[str], err: BaseException) -> Exception:
    """The error of a call that a healthy worker refused: a ValueError (the caller's bad input, as the local backend
    says it) carrying the worker's message, which names the refused request (``RolloutWorkerActor._submit_all``),
    whichever failed call of its share returned first; another error, a RuntimeError naming the call's requests."""
    cause = getattr(err, "cause", None)
    cause = cause if isinstance(cause, BaseException) else err
    if isinstance(cause, ValueError):
        return ValueError(f"{cause} (refused by rollout worker {worker_id})")
    return RuntimeError(f"rollout worker {worker_id} refused requests {request_ids}: {short_error(err)}")


def _get_or_none(ref: ray.ObjectRef) -> list[RolloutResult] | None:
    """The results of a finished call, or None when its worker died or failed before returning them (the call
    raised: its requests re-run elsewhere)."""
    try:
        return ray.get(ref)
    except RayError:
        return None


def require_ray() -> None:
    """RuntimeError when Ray is not running in this process (``ray.shutdown()`` under the rollout manager): a Ray
    call would silently start a fresh local Ray, where none of the manager's workers or objects exist."""
    if not ray.is_initialized():
        raise RuntimeError(
            "Ray was shut down under the rollout manager (ray.shutdown() while it ran): its workers are gone; "
            "start a new RayRolloutManager"
        )
