"""RolloutBackend in this process: one EngineWorker, no Ray; co-training runs after each batch."""

from __future__ import annotations

import random
import time

from torch import Tensor

from fastrl.rollout.dispatch import check_request_ids, with_seeds
from fastrl.rollout.drafter_round import DrafterAtBoundary, close_drafter_round
from fastrl.rollout.engine_worker import EngineWorker
from fastrl.rollout.types import DrafterTrainingStats, RolloutBatch, RolloutRequest, WorkerTiming
from fastrl.rollout.worker_config import RolloutWorkerConfig
from fastrl.rollout.worker_cotrain import CotrainState
from fastrl.speculative.history import HistoryState, merge_history_states

WORKER_ID = "local-0"


class LocalRollout:
    """The rollout backend for tests and for machines without Ray.

    With ``config.cotrain`` (and ``cotrain_after_batch``), each ``generate`` is followed by co-training on the
    hidden states collected so far: ``config.schedule.updates_per_rollout`` steps (``steps`` schedule) or one slice
    of ``config.slice_seconds`` (``time``); the trained copy becomes the next drafter version (there is no idle
    worker to hide it behind, so it adds that time to the rollout).
    """

    def __init__(self, config: RolloutWorkerConfig, seed: int = 0, cotrain_after_batch: bool = True) -> None:
        self.config = config
        self.worker = EngineWorker(WORKER_ID, config)
        self.cotrain_after_batch = cotrain_after_batch
        self._seed_rng = random.Random(seed)
        self._last_round = (DrafterTrainingStats(), self.worker.drafter_version)
        self._boundary_drafter = DrafterAtBoundary()

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
        if self.cotrain_after_batch and self.worker.cotraining is not None and requests:
            slices = []
            if not self.config.schedule.deterministic:  # the wall-clock mode: one slice of slice_seconds
                slices.append((WORKER_ID, self.worker.train_drafter_slice(self.config.slice_seconds)))
            drafter = close_drafter_round(
                lambda method: [getattr(self.worker, method)()],
                self.worker.drafter_version,
                self._push_merged_drafter,
                slices,
            )
        self._last_round = (drafter, self.worker.drafter_version)
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

    def finish_rollout(self) -> tuple[DrafterTrainingStats, int]:
        """The last batch's co-training and the drafter version after it (``generate`` already finished it)."""
        return self._last_round

    def _push_merged_drafter(self, version: int, state: dict[str, Tensor]) -> None:
        """Install a drafter round's merged version, the boundary's drafter kept first (``DrafterAtBoundary``)."""
        self._boundary_drafter.before_change(self.worker.drafter_state)
        self.worker.update_drafter(version, state)

    def update_policy(self, version: int, state: dict[str, Tensor]) -> None:
        self.worker.update_policy(version, state)
        self._boundary_drafter.mark()

    def drafter_state(self) -> tuple[int, dict[str, Tensor]]:
        """The drafter at the last step boundary (the last policy push), for checkpoints."""
        return self._boundary_drafter.state(self.worker.drafter_state)

    def load_drafter_state(self, version: int, state: dict[str, Tensor]) -> None:
        self.worker.update_drafter(version, state)

    def selector_state(self) -> dict:
        """``{"workers": [state]}``, the same layout as the Ray backend's."""
        return {"workers": [self.worker.selector_state()]}

    def check_selector_state(self, state: dict) -> None:
        self.config.checked_selector_states(state)

    def load_selector_state(self, state: dict) -> None:
        self.worker.load_selector_state(self.config.checked_selector_states(state)[0])

    def history_state(self) -> list[HistoryState | None]:
        """``[state]`` of the one worker, the same layout as the Ray backend's."""
        return [self.worker.history_state()]

    def load_history_state(self, states: list[HistoryState | None]) -> None:
        """Restore every slot's state into the one worker: a Ray run's checkpoint holds one per worker slot, and their
        groups are folded into one index (``merge_history_states``: the slots interleaved from their most recently
        used groups, restored oldest first, so that the token budget evicts the oldest as usual). None: a worker
        without a history index."""
        held = [state for state in states if state is not None]
        if held:
            self.worker.load_history_state(merge_history_states(held) if len(held) > 1 else held[0])

    def cotrain_state(self) -> list[CotrainState]:
        """``[state]`` of the one worker ([] without co-training), the same layout as the Ray backend's."""
        state = self.worker.cotrain_state()
        return [] if state is None else [state]

    def load_cotrain_state(self, states: list[CotrainState]) -> None:
        """Restore ``[state]`` (left unused by a run without co-training, as the Ray backend does)."""
        if self.worker.cotraining is None:
            return
        if len(states) != 1:
            raise ValueError(f"the checkpoint holds co-training state for {len(states)} workers; rollout=local has 1")
        self.worker.load_cotrain_state(states[0])

    def shutdown(self) -> None:
        """Nothing to release."""
