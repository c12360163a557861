"""What one bandit arm observed in one bucket: a sliding window of rounds, round times by batch size, totals.

Each round keeps its batch size, accept-length sum (accepted + 1 over the rows) and reward in the window. Round
times are kept apart, per exact batch size, as an exponential moving average: a round's cost depends on the batch
size and barely on the training phase, so it is worth remembering longer than acceptance, which drifts.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

TIME_EMA_ALPHA = 0.25


@dataclass(frozen=True)
class RoundSample:
    """One round as an arm's window keeps it."""

    batch_size: int
    wall_time_s: float
    accept_sum: float
    reward: float


class ArmRewards:
    """Sliding window of ``RoundSample`` for one (bucket, arm), round time per batch size, and all-time totals."""

    def __init__(self, window_size: int) -> None:
        self.window_size = window_size
        self.window: deque[RoundSample] = deque()
        self.times: dict[int, float] = {}
        self._sizes: list[int] = []
        self.pulls = 0
        self.total_reward = 0.0

    def add(self, sample: RoundSample) -> None:
        """Record one round (evicting the oldest once the window is full)."""
        self.window.append(sample)
        if len(self.window) > self.window_size:
            self.window.popleft()
        b, t = sample.batch_size, sample.wall_time_s
        if b in self.times:
            self.times[b] += TIME_EMA_ALPHA * (t - self.times[b])
        else:
            self.times[b] = t
            bisect.insort(self._sizes, b)
        self.pulls += 1
        self.total_reward += sample.reward

    def __len__(self) -> int:
        return len(self.window)

    def rows(self) -> int:
        """Request rows in the window."""
        return sum(s.batch_size for s in self.window)

    def accept_sum(self) -> float:
        """Accept-length sum (tokens per request per round, summed over rows) in the window."""
        return sum(s.accept_sum for s in self.window)

    def accept_length(self) -> float:
        """Mean tokens per request per round over the window, weighting rounds by their rows."""
        return self.accept_sum() / self.rows()

    def time_bracket(self, batch_size: int) -> tuple[int | None, int | None]:
        """The measured batch sizes nearest ``batch_size`` from below and from above (equal counts as both)."""
        i = bisect.bisect_left(self._sizes, batch_size)
        above = self._sizes[i] if i < len(self._sizes) else None
        if above == batch_size:
            return batch_size, batch_size
        below = self._sizes[i - 1] if i > 0 else None
        return below, above

    def interpolated_time(self, batch_size: int) -> float | None:
        """Round time at ``batch_size``, linear between the nearest measured batch sizes; None outside them."""
        below, above = self.time_bracket(batch_size)
        if below is None or above is None:
            return None
        if below == above:
            return self.times[below]
        frac = (batch_size - below) / (above - below)
        return self.times[below] + frac * (self.times[above] - self.times[below])

    def nearest_size(self, batch_size: int) -> int | None:
        """The measured batch size nearest ``batch_size`` (None before the first round)."""
        below, above = self.time_bracket(batch_size)
        if below is None or above is None:
            return below if above is None else above
        return below if batch_size - below <= above - batch_size else above

    def window_mean(self) -> float | None:
        """Mean reward over the window (None before the first round)."""
        return sum(s.reward for s in self.window) / len(self.window) if self.window else None

    def all_time_mean(self) -> float | None:
        """Mean reward over every round ever recorded (None before the first)."""
        return self.total_reward / self.pulls if self.pulls else None

    def state(self) -> dict:
        """Plain-data snapshot."""
        return {
            "window": [[s.batch_size, s.wall_time_s, s.accept_sum, s.reward] for s in self.window],
            "times": [[b, t] for b, t in sorted(self.times.items())],
            "pulls": self.pulls,
            "total_reward": self.total_reward,
        }

    def load(self, state: dict) -> None:
        """Restore a snapshot taken by ``state``."""
        self.window = deque(RoundSample(int(b), float(t), float(a), float(r)) for b, t, a, r in state["window"])
        self.times = {int(b): float(t) for b, t in state["times"]}
        self._sizes = sorted(self.times)
        self.pulls = int(state["pulls"])
        self.total_reward = float(state["total_reward"])
