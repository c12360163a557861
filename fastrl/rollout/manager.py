"""RolloutBackend over Ray worker actors: balanced dispatch, co-training in the tail, versioned weight pushes,
recovery from dead workers."""

from __future__ import annotations

import itertools
import random
import time

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from torch import Tensor

from fastrl.cotrain.cotrainer import TrainedDrafter, average_drafters
from fastrl.rollout.cluster import ensure_ray
from fastrl.rollout.cotrain_stats import summarize_slices
from fastrl.rollout.dispatch import check_request_ids, with_seeds
from fastrl.rollout.manager_config import RolloutManagerConfig
from fastrl.rollout.ray_worker import start_worker
from fastrl.rollout.rollout_run import RolloutRun, RunOutcome, WorkerHandle
from fastrl.rollout.types import DrafterTrainingStats, RolloutBatch, RolloutRequest, RoundRecord
from fastrl.rollout.worker_stats import WorkerStats


class RayRolloutManager:
    """N rollout worker actors behind the RolloutBackend interface.

    ``generate`` spreads the batch (groups kept together, balanced by max_new_tokens) and returns results in request
    order. Workers whose share is done while others run the tail train the drafter in short slices; afterwards the
    copies trained this rollout are averaged (weighted by steps) into drafter version v + 1, pushed to every worker.
    A worker that dies mid-rollout has its unfinished requests re-run on the survivors (``retried_requests``) and,
    with ``restart_failed_workers``, is replaced by a fresh actor brought to the current weight versions.
    """

    def __init__(self, config: RolloutManagerConfig) -> None:
        self.config = config
        self._owns_ray = ensure_ray(config.ray_address or None, config.ray_num_cpus)
        self._spawned = 0
        self.workers: list[WorkerHandle] = [self._spawn() for _ in range(config.num_workers)]
        try:
            first: WorkerStats = ray.get([w.actor.stats.remote() for w in self.workers])[0]
        except RayActorError as err:
            self.shutdown()
            raise RuntimeError(f"a rollout worker failed to start: {err}") from err
        self.policy_version = first.policy_version
        self.drafter_version = first.drafter_version
        self.replaced_workers = 0
        self._policy_ref: ray.ObjectRef | None = None
        self._drafter_ref: ray.ObjectRef | None = None
        self._seed_rng = random.Random(config.seed)
        self._slice_ids = itertools.count(1)

    # ---- RolloutBackend ---------------------------------------------------------------------------------------
    def generate(self, requests: list[RolloutRequest]) -> RolloutBatch:
        """Generate every request; results in request order, with per-worker timing, rounds and co-training."""
        start = time.perf_counter()
        if not requests:
            return RolloutBatch([], 0.0, 0.0, [], [], DrafterTrainingStats(), self.drafter_version)
        check_request_ids(requests)
        requests = with_seeds(requests, self._seed_rng)
        self._await_ready()
        cotrain = self.config.cotrain_in_tail and self.config.worker.cotrain
        run = RolloutRun(requests, self._alive(), cotrain, self.config.worker.slice_seconds, self._slice_ids)
        outcome = run.run()
        rounds = self._take_rounds()
        drafter = summarize_slices(outcome.slices)
        self._publish_trained(outcome, drafter)
        self._replace_dead()
        return RolloutBatch(
            results=outcome.results,
            wall_time_s=time.perf_counter() - start,
            tail_time_s=outcome.tail_time_s,
            workers=outcome.timings,
            rounds=rounds,
            drafter=drafter,
            drafter_version=self.drafter_version,
            retried_requests=outcome.retried_requests,
        )

    def update_policy(self, version: int, state: dict[str, Tensor]) -> None:
        """Put ``state`` in the object store once and install it as ``version`` on every worker."""
        self._await_ready()
        ref = ray.put(state)
        self._policy_ref, self.policy_version = ref, int(version)
        self._call_all("update_policy", self.policy_version, ref)
        self._replace_dead()

    def drafter_state(self) -> tuple[int, dict[str, Tensor]]:
        """The current drafter version and (CPU float32) weights; {} when the workers run without a drafter."""
        if self._drafter_ref is not None:
            state = ray.get(self._drafter_ref)
            return self.drafter_version, {k: v.clone() for k, v in state.items()}
        self._await_ready()
        version, state = self._call_all("drafter_state")[0]
        return version, state

    def load_drafter_state(self, version: int, state: dict[str, Tensor]) -> None:
        """Install drafter weights as ``version`` on every worker (resume)."""
        self._await_ready()
        self._push_drafter(int(version), state)

    def policy_state(self) -> dict:
        """Each worker's strategy-policy state: ``{"workers": [state, ...]}`` in worker order."""
        self._await_ready()
        return {"workers": self._call_all("policy_state")}

    def load_policy_state(self, state: dict) -> None:
        """Worker i loads ``state["workers"][i % n]`` (a resumed run may have a different worker count)."""
        states = state.get("workers") if isinstance(state, dict) else None
        if not isinstance(states, list) or not states:
            raise ValueError("load_policy_state: expected {'workers': [state, ...]} as returned by policy_state()")
        self._await_ready()
        refs = [(w, w.actor.load_policy_state.remote(states[i % len(states)])) for i, w in enumerate(self._alive())]
        self._gather(refs)

    def shutdown(self) -> None:
        """Kill every worker actor (and Ray itself when this manager started it)."""
        for w in self.workers:
            try:
                ray.kill(w.actor)
            except (RayActorError, ValueError):
                pass
        self.workers = []
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
            self._owns_ray = False

    # ---- reports ----------------------------------------------------------------------------------------------
    def worker_stats(self) -> list[WorkerStats]:
        """Every live worker's stats (versions, requests served, rounds, buffer, co-training steps)."""
        self._await_ready()
        return self._call_all("stats")

    # ---- internals --------------------------------------------------------------------------------------------
    def _spawn(self) -> WorkerHandle:
        worker_id = f"worker-{self._spawned}"
        self._spawned += 1
        return WorkerHandle(worker_id, start_worker(worker_id, self.config.worker))

    def _alive(self) -> list[WorkerHandle]:
        alive = [w for w in self.workers if w.alive]
        if not alive:
            raise RuntimeError("no rollout worker is alive")
        return alive

    def _gather(self, calls: list[tuple[WorkerHandle, ray.ObjectRef]]) -> list:
        """Results of per-worker calls, in order, skipping (and marking) workers that died."""
        out = []
        for worker, ref in calls:
            try:
                out.append(ray.get(ref))
            except RayActorError:
                worker.alive = False
        return out

    def _call_all(self, method: str, *args: object) -> list:
        return self._gather([(w, getattr(w.actor, method).remote(*args)) for w in self._alive()])

    def _take_rounds(self) -> list[RoundRecord]:
        return [r for rounds in self._call_all("take_rounds") for r in rounds]

    def _publish_trained(self, outcome: RunOutcome, stats: DrafterTrainingStats) -> None:
        """Average the drafters trained this rollout (weighted by steps) into the next version; push it."""
        trainers = {t.worker_id for t in outcome.timings if t.cotrain_steps > 0}
        calls = [(w, w.actor.trained_drafter.remote()) for w in self._alive() if w.worker_id in trainers]
        trained: list[TrainedDrafter] = [t for t in self._gather(calls) if t is not None]
        items = [(t.state, float(t.steps)) for t in trained if t.base_version == self.drafter_version]
        if not items:
            return
        try:
            merged = average_drafters(items)
        except ValueError as err:
            stats.failures.append(f"merge: {err}")
            return
        self._push_drafter(self.drafter_version + 1, merged)

    def _push_drafter(self, version: int, state: dict[str, Tensor]) -> None:
        ref = ray.put(state)
        self._drafter_ref, self.drafter_version = ref, version
        self._call_all("update_drafter", version, ref)

    def _replace_dead(self) -> None:
        """Start a fresh actor for each dead worker, with the current policy and drafter weights pushed to it."""
        if not self.config.restart_failed_workers:
            return
        for i, w in enumerate(self.workers):
            if w.alive:
                continue
            fresh = self._spawn()
            if self._policy_ref is not None:
                fresh.ready.append(fresh.actor.update_policy.remote(self.policy_version, self._policy_ref))
            if self._drafter_ref is not None:
                fresh.ready.append(fresh.actor.update_drafter.remote(self.drafter_version, self._drafter_ref))
            fresh.ready.append(fresh.actor.health.remote())
            self.workers[i] = fresh
            self.replaced_workers += 1

    def _await_ready(self) -> None:
        """Wait for replacements to finish starting; one that fails or times out is dropped."""
        for w in self.workers:
            if not w.ready:
                continue
            try:
                ray.get(w.ready, timeout=self.config.worker_start_timeout_s)
            except (RayActorError, GetTimeoutError):
                w.alive = False
                ray.kill(w.actor)
            w.ready = []
        self.workers = [w for w in self.workers if w.alive]
