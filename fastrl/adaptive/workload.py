"""Synthetic GRPO rollout workloads: heavy-tailed response lengths and drafter acceptance that changes in phases.

A workload is a sequence of rollouts. Each rollout starts ``requests_per_rollout`` requests together and runs until
the longest finishes, so the running batch decays from its full size through a long tail to 1. Response lengths are
log-normal (capped). Phases model training: between rollouts the policy moves and the drafter is retrained, so the
acceptance profile changes at chosen rollouts (the drafter improves under co-training, or falls behind a drifting
policy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastrl.adaptive.acceptance import AcceptanceProfile


@dataclass(frozen=True)
class Phase:
    """An acceptance profile in force from rollout ``start_rollout`` on."""

    start_rollout: int
    acceptance: AcceptanceProfile
    name: str = ""


@dataclass(frozen=True)
class Workload:
    """A GRPO-like sequence of rollouts; ``phases`` sorted by ``start_rollout``, the first starting at 0."""

    name: str
    phases: tuple[Phase, ...]
    num_rollouts: int = 6
    requests_per_rollout: int = 64
    median_length: int = 400
    length_sigma: float = 0.9
    min_length: int = 16
    max_length: int = 8192

    def __post_init__(self) -> None:
        if not self.phases or self.phases[0].start_rollout != 0:
            raise ValueError(f"workload {self.name!r}: phases must be non-empty and the first must start at rollout 0")
        starts = [phase.start_rollout for phase in self.phases]
        if starts != sorted(set(starts)):
            raise ValueError(f"workload {self.name!r}: phase start_rollout values must be strictly increasing")
        if self.num_rollouts < 1 or self.requests_per_rollout < 1:
            raise ValueError(f"workload {self.name!r}: num_rollouts and requests_per_rollout must be >= 1")
        if not 1 <= self.min_length <= self.median_length <= self.max_length:
            raise ValueError(f"workload {self.name!r}: need 1 <= min_length <= median_length <= max_length")

    def phase_index(self, rollout: int) -> int:
        """Index into ``phases`` of the phase in force during ``rollout``."""
        index = 0
        for i, phase in enumerate(self.phases):
            if phase.start_rollout <= rollout:
                index = i
        return index

    def sample_lengths(self, rng: np.random.Generator) -> np.ndarray:
        """Response lengths (tokens) of one rollout's requests. [requests_per_rollout] int"""
        raw = self.median_length * np.exp(self.length_sigma * rng.standard_normal(self.requests_per_rollout))
        return np.clip(np.round(raw), self.min_length, self.max_length).astype(np.int64)


def standard_workloads(num_rollouts: int = 6) -> list[Workload]:
    """The workloads of the simulation table: stationary, a drafter that improves, and a policy that drifts."""
    if num_rollouts < 2:
        raise ValueError(f"standard workloads need num_rollouts >= 2, got {num_rollouts}")
    mid = num_rollouts // 2
    weak, medium, strong = AcceptanceProfile(0.5), AcceptanceProfile(0.65), AcceptanceProfile(0.8)
    return [
        Workload("stationary", (Phase(0, medium, "medium"),), num_rollouts=num_rollouts),
        Workload(
            "drafter-improves",
            (Phase(0, weak, "weak"), Phase(mid, strong, "strong")),
            num_rollouts=num_rollouts,
        ),
        Workload(
            "policy-drift",
            (Phase(0, strong, "strong"), Phase(mid, weak, "weak")),
            num_rollouts=num_rollouts,
        ),
        Workload(
            "large-batch",
            (Phase(0, medium, "medium"), Phase(mid, strong, "strong")),
            num_rollouts=num_rollouts,
            requests_per_rollout=256,
            median_length=300,
            length_sigma=0.7,
        ),
    ]
