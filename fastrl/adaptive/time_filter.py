"""A Kalman filter over the log round-time residuals of every arm: one shared load, a bias curve per arm.

A round of ``arm`` over ``b`` rows that took ``t`` seconds is modelled as ``log t = log calibrated(arm, b) + load +
bias(arm, b) + noise``: ``load`` is the machine's state at the moment (shared by every arm, a random walk from round
to round), ``bias(arm, b)`` what the calibration got wrong about that arm (interpolated in log batch size between
knots at the arm's calibration sizes, drifting slowly). Load and biases are told apart only by the biases' priors and
by rounds of different arms close in time: a stretch of one arm cannot tell a slower machine from a costlier arm.
The fixed-rate split this replaces learned that split wherever the first rounds put it (one slow warm-up round left
the load 13% high and plain's bias as much below for a whole run); the filter weighs each round by what is still
uncertain and keeps the covariance of its whole state, so a plain round after a stretch of ``3_1_4`` rounds corrects
the load *and* ``3_1_4``'s bias, which that stretch left negatively correlated with it.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from fastrl.strategy.strategy import Strategy

ROUND_STD = 0.15
"""Noise of one round's log time (rounds of a few ms scatter by ~15% on a shared CPU)."""
LOAD_DRIFT_STD = 0.08
"""How far the load's log may move from one round to the next: a plain round then weighs ~0.2 in the load."""
BIAS_DRIFT_STD = 0.005
"""How far an arm's bias may move per round (contexts grow during a rollout): an idle arm's regains uncertainty."""
CLIP_SIGMAS = 3.0
"""Largest innovation learned from, in standard deviations of its prediction (a stalled round counts as 3)."""


@dataclass(frozen=True)
class ArmPrior:
    """An arm's bias curve before any round: knots at ``sizes`` (batch sizes), each ``mean`` with ``std``, knots of one
    arm correlated by ``correlation``."""

    sizes: tuple[int, ...]
    mean: float
    std: float
    correlation: float

    def covariance(self) -> np.ndarray:
        """Prior covariance of the knots.  # [k, k]"""
        k = len(self.sizes)
        return self.std**2 * (self.correlation + (1.0 - self.correlation) * np.eye(k))

    def to_state(self) -> list:
        """Plain data: [sizes, mean, std, correlation] (``from_state`` reads it back)."""
        return [list(self.sizes), self.mean, self.std, self.correlation]

    @classmethod
    def from_state(cls, saved: list) -> ArmPrior:
        """The prior as ``LogTimeFilter.state`` writes it: [sizes, mean, std, correlation]."""
        sizes, mean, std, correlation = saved
        return cls(tuple(int(s) for s in sizes), float(mean), float(std), float(correlation))


class LogTimeFilter:
    """State ``[load, bias knots of each arm]`` with its covariance (see the module docstring)."""

    def __init__(self, load_std: float) -> None:
        self.mean = np.zeros(1)  # [n]
        self.cov = np.full((1, 1), load_std**2)  # [n, n]
        self._knots: dict[Strategy, tuple[int, tuple[int, ...]]] = {}  # arm -> (first index, sizes)
        self._rows: dict[tuple[Strategy, int], list[tuple[int, float]]] = {}  # observation rows, until knots change
        self._dense: dict[tuple[Strategy, int], np.ndarray] = {}  # the same rows as [n] vectors, likewise
        self._drift = np.full(1, LOAD_DRIFT_STD**2)  # [n] variance each state gains per round
        self._priors: dict[Strategy, ArmPrior] = {}

    def has(self, arm: Strategy) -> bool:
        """True when ``arm`` has a bias curve."""
        return arm in self._knots

    def add(self, arm: Strategy, prior: ArmPrior) -> None:
        """Give ``arm`` a bias curve starting at ``prior`` (uncorrelated with the rest of the state)."""
        if arm in self._knots:
            raise ValueError(f"arm {str(arm)!r} already has a bias curve")
        k, n = len(prior.sizes), self.mean.shape[0]
        cov = np.zeros((n + k, n + k))
        cov[:n, :n], cov[n:, n:] = self.cov, prior.covariance()
        self.mean = np.concatenate([self.mean, np.full(k, prior.mean)])
        self.cov = cov
        self._knots[arm] = (n, tuple(prior.sizes))
        self._priors[arm] = prior
        self._rows.clear()
        self._dense.clear()
        self._drift = np.concatenate([self._drift, np.full(k, BIAS_DRIFT_STD**2)])

    def predict(self, arm: Strategy, batch_size: int) -> float:
        """Expected log residual of a round of ``arm`` at ``batch_size``: load + bias."""
        return sum(w * self.mean[i] for i, w in self._row(arm, batch_size))

    def observe(self, arm: Strategy, batch_size: int, residual: float) -> None:
        """One round's log residual (log seconds less log calibrated): drift every state one round, then the
        Kalman update, the innovation clipped at ``CLIP_SIGMAS``."""
        n = self.mean.shape[0]
        self.cov.flat[:: n + 1] += self._drift
        key = (arm, batch_size)
        if key not in self._dense:
            self._dense[key] = np.zeros(n)
            for i, w in self._row(arm, batch_size):
                self._dense[key][i] = w
        row = self._dense[key]  # [n]  H
        gain_num = self.cov @ row  # [n]  P H^T
        spread = float(row @ gain_num) + ROUND_STD**2  # H P H^T + R
        limit = CLIP_SIGMAS * math.sqrt(spread)
        innovation = max(-limit, min(limit, residual - self.predict(arm, batch_size)))
        self.mean += gain_num * (innovation / spread)
        self.cov -= np.outer(gain_num, gain_num) / spread  # bit-symmetric, as a covariance must stay

    def _row(self, arm: Strategy, batch_size: int) -> list[tuple[int, float]]:
        """Observation row of ``arm`` at ``batch_size``: (state index, weight) pairs, the load's first."""
        key = (arm, batch_size)
        if key not in self._rows:
            self._rows[key] = self._knot_row(arm, batch_size)
        return self._rows[key]

    def _knot_row(self, arm: Strategy, batch_size: int) -> list[tuple[int, float]]:
        if arm not in self._knots:
            return [(0, 1.0)]
        start, sizes = self._knots[arm]
        i = bisect.bisect_left(sizes, batch_size)
        if i < len(sizes) and sizes[i] == batch_size:
            return [(0, 1.0), (start + i, 1.0)]
        if i == 0 or i == len(sizes):
            return [(0, 1.0), (start + min(i, len(sizes) - 1), 1.0)]
        lo, hi = sizes[i - 1], sizes[i]
        frac = math.log(batch_size / lo) / math.log(hi / lo)
        return [(0, 1.0), (start + i - 1, 1.0 - frac), (start + i, frac)]

    def state(self) -> dict:
        """Plain-data snapshot: every arm's knots and prior, the mean and the covariance."""
        return {
            "arms": {
                str(arm): {"start": start, "prior": self._priors[arm].to_state()}
                for arm, (start, _) in self._knots.items()
            },
            "mean": self.mean.tolist(),
            "cov": self.cov.tolist(),
        }

    def load(self, state: dict) -> None:
        """Take the load and the bias knots ``state`` shares with this filter (an arm with the same prior): their
        means and covariances; the rest keep their priors, uncorrelated with them (arms only ``state`` has are
        ignored)."""
        mean, cov = np.asarray(state["mean"], dtype=float), np.asarray(state["cov"], dtype=float)
        if mean.shape[0] != cov.shape[0] or cov.shape != (mean.shape[0], mean.shape[0]):
            raise ValueError(f"round-time state: mean of {mean.shape[0]} entries but covariance of shape {cov.shape}")
        layout = {str(arm): (start, self._priors[arm]) for arm, (start, _) in self._knots.items()}
        here, there = shared_indices(state["arms"], layout)
        taken = set(here)
        rest = [i for i in range(self.mean.shape[0]) if i not in taken]
        self.mean[here] = mean[there]
        self.cov[np.ix_(here, here)] = cov[np.ix_(there, there)]
        self.cov[np.ix_(here, rest)] = 0.0
        self.cov[np.ix_(rest, here)] = 0.0


def shared_indices(saved_arms: dict, layout: dict[str, tuple[int, ArmPrior]]) -> tuple[list[int], list[int]]:
    """The state entries a saved filter (its ``"arms"``) shares with ``layout`` ({arm: (first index, prior)}): their
    indices here and there, the load's first; an arm counts only where both have the same prior."""
    here, there = [0], [0]
    for name, saved in saved_arms.items():
        entry = layout.get(name)
        if entry is None or entry[1] != ArmPrior.from_state(saved["prior"]):
            continue
        start, prior = entry
        here += range(start, start + len(prior.sizes))
        there += range(int(saved["start"]), int(saved["start"]) + len(prior.sizes))
    return here, there
