"""What one arm's rounds earned in one bucket, for telemetry: pulls, a recent and an all-time mean reward."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ArmRewards:
    """Pulls, the EMA of the reward over about the last ``1 / alpha`` rounds, and the all-time total."""

    pulls: int = 0
    recent: float = 0.0
    total: float = 0.0

    def add(self, reward: float, alpha: float) -> None:
        """Count one round's reward (the EMA is a plain mean over its first ``1 / alpha`` rounds)."""
        self.pulls += 1
        self.recent += (reward - self.recent) * max(alpha, 1.0 / self.pulls)
        self.total += reward

    def recent_mean(self) -> float | None:
        """Recent mean reward (None before the first round)."""
        return self.recent if self.pulls else None

    def all_time_mean(self) -> float | None:
        """Mean reward over every round (None before the first)."""
        return self.total / self.pulls if self.pulls else None

    def state(self) -> list:
        """Plain-data snapshot."""
        return [self.pulls, self.recent, self.total]

    @classmethod
    def load(cls, state: list) -> ArmRewards:
        """Rebuild from ``state``."""
        return cls(int(state[0]), float(state[1]), float(state[2]))
