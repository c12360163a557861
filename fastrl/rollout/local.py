"""RolloutBackend in this process: one EngineWorker, no Ray; co-training runs after each batch."""

from __future__ import annotations

import random
import time

from torch import Tensor

from fastrl.cotrain.cotrainer import average_drafters
from fastrl.rollout.cotrain_stats import summarize_slices
from fastrl.rollout.dispatch import check_request_ids, with_seeds
from fastrl.rollout.engine_worker import EngineWorker
from fastrl.rollout.types import DrafterTrainingStats, RolloutBatch, RolloutRequest, WorkerTiming
from fastrl.rollout.worker_config import RolloutWorkerConfig

WORKER_ID = "local-0"


class LocalRollout:
    """The rollout backend for tests and for machines without Ray.

    With ``config.cotrain`` (and ``cotrain_after_batch``), each ``generate`` is followed by one co-training slice of
    ``config.slice_seconds`` on the hidden states just collected, and the trained copy becomes the next drafter
    version (there is no idle worker to hide it behind, so it adds that time to the rollout).
    """

    def __init__(self, config: RolloutWorkerConfig, seed: int = 0, cotrain_after_batch: bool = True) -> None:
        self.config = config
        self.worker = EngineWorker(WORKER_ID, config)
        self.cotrain_after_batch = cotrain_after_batch
        self._seed_rng = random.Random(seed)

    @property
    def policy_version(self) -> int:
        return self.worker.policy_version

    @property
    def drafter_version(self) -> int:
        return self.worker.drafter_version

    def generate(self, requests: list[RolloutRequest]) -> RolloutBatch:
        """Generate every request in order, then co-train (when on) and publish the new drafter version."""
        start = time.perf_counter()
        check_request_ids(requests)
        results = self.worker.generate(with_seeds(requests, self._seed_rng))
        busy = time.perf_counter() - start
        rounds = self.worker.take_rounds()
        drafter = DrafterTrainingStats()
        if self.cotrain_after_batch and self.worker.cotrainer is not None and requests:
            slice_metrics = self.worker.train_drafter_slice(self.config.slice_seconds)
            drafter = summarize_slices([(WORKER_ID, slice_metrics)])
            trained = self.worker.trained_drafter()
            if trained is not None:
                try:
                    merged = average_drafters([(trained.state, float(trained.steps))])
                    self.worker.update_drafter(self.worker.drafter_version + 1, merged)
                except ValueError as err:
                    drafter.failures.append(f"merge: {err}")
        timing = WorkerTiming(WORKER_ID, len(results), busy, 0.0, drafter.seconds, drafter.steps)
        return RolloutBatch(
            results=results,
            wall_time_s=time.perf_counter() - start,
            tail_time_s=0.0,
            workers=[timing],
            rounds=rounds,
            drafter=drafter,
            drafter_version=self.worker.drafter_version,
        )

    def update_policy(self, version: int, state: dict[str, Tensor]) -> None:
        self.worker.update_policy(version, state)

    def drafter_state(self) -> tuple[int, dict[str, Tensor]]:
        return self.worker.drafter_state()

    def load_drafter_state(self, version: int, state: dict[str, Tensor]) -> None:
        self.worker.update_drafter(version, state)

    def selector_state(self) -> dict:
        """``{"workers": [state]}``, the same layout as the Ray backend's."""
        return {"workers": [self.worker.selector_state()]}

    def load_selector_state(self, state: dict) -> None:
        states = state.get("workers") if isinstance(state, dict) else None
        if not isinstance(states, list) or not states:
            raise ValueError("load_selector_state: expected {'workers': [state, ...]} as returned by selector_state()")
        self.worker.load_selector_state(states[0])

    def shutdown(self) -> None:
        """Nothing to release."""
