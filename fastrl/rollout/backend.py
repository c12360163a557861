"""The interface the RL trainer drives: any rollout system (in-process engine, Ray workers) implements it."""

from __future__ import annotations

from typing import Protocol

import torch

from fastrl.rollout.types import DrafterTrainingStats, RolloutBatch, RolloutRequest
from fastrl.rollout.worker_cotrain import CotrainState
from fastrl.speculative.history import HistoryState


class RolloutBackend(Protocol):
    """Generates GRPO batches and receives new weights.

    `generate` returns results in request order. `update_policy` installs new policy weights (tagged with their
    version) on every worker before the next rollout. Co-training backends train the drafter during the rollout
    tail and publish a new drafter version at its end (visible in RolloutBatch.drafter_version); `drafter_state`
    returns the current drafter weights (for checkpoints), `load_drafter_state` restores them.
    """

    def generate(self, requests: list[RolloutRequest]) -> RolloutBatch:
        """Generate every request; results in the same order."""
        ...

    def finish_rollout(self) -> tuple[DrafterTrainingStats, int]:
        """The co-training of the last `generate` (its stats, and the drafter version after it). A backend may
        leave it running when `generate` returns, so it overlaps the caller's policy update; this call (and any
        other) finishes it. Call it before `update_policy`."""
        ...

    def update_policy(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Install policy weights `state` (HF parameter names) as `version` on every worker."""
        ...

    def drafter_state(self) -> tuple[int, dict[str, torch.Tensor]]:
        """The current drafter version and weights."""
        ...

    def load_drafter_state(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Install drafter weights as `version` on every worker (resume)."""
        ...

    def selector_state(self) -> dict:
        """The strategy policies' state (e.g. bandit windows), for exact resume."""
        ...

    def check_selector_state(self, state: dict) -> None:
        """ValueError naming what is wrong when `load_selector_state` could not restore ``state`` (nothing loaded)."""
        ...

    def load_selector_state(self, state: dict) -> None:
        """Restore what `selector_state` returned."""
        ...

    def history_state(self) -> list[HistoryState | None]:
        """Each worker's history index (prompts and kept responses), in slot order; None for a worker without one."""
        ...

    def load_history_state(self, states: list[HistoryState]) -> None:
        """Restore what `history_state` returned: worker slot i takes ``states[i]`` when there is one."""
        ...

    def cotrain_state(self) -> list[CotrainState]:
        """Each worker's co-training state (feature buffer, drafter optimiser, step counters), in slot order; []
        without co-training."""
        ...

    def load_cotrain_state(self, states: list[CotrainState]) -> None:
        """Restore what `cotrain_state` returned (after `load_drafter_state`); a backend without co-training leaves
        it unused."""
        ...

    def shutdown(self) -> None:
        """Release workers."""
        ...
