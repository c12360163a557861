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

from fastrl.json_values import is_int, is_real
from fastrl.strategy.strategy import Strategy

ROUND_STD = 0.15
"""Noise of one round's log time (rounds of a few ms scatter by ~15% on a shared CPU)."""
LOAD_DRIFT_STD = 0.08
"""How far the load's log may move from one round to the next: a plain round then weighs ~0.2 in the load."""
BIAS_DRIFT_STD = 0.005
"""How far an arm's bias may move per round (contexts grow during a rollout): an idle arm's regains uncertainty."""
CLIP_SIGMAS = 3.0
"""Largest innovation learned from, in standard deviations of its prediction (a stalled round counts as 3)."""
MAX_LOG_RESIDUAL = 100.0
"""Largest load or bias a saved filter may hold (a factor of e**100 on a round time is no machine's; a prediction
adds three of them, and beyond e**709 a round time is no float)."""


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
        """The prior as ``LogTimeFilter.state`` writes it: [sizes, mean, std, correlation]; ValueError unless the
        sizes are increasing positive ints, the mean finite, the std positive and finite, the correlation in [0, 1)."""
        if not isinstance(saved, list) or len(saved) != 4:
            raise ValueError(f"a prior is [sizes, mean, std, correlation], got {saved!r}")
        sizes, mean, std, correlation = saved
        if not isinstance(sizes, list) or not sizes or not all(is_int(s) and s >= 1 for s in sizes):
            raise ValueError(f"a prior's sizes are positive ints, got {sizes!r}")
        if any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
            raise ValueError(f"a prior's sizes are strictly increasing, got {sizes!r}")
        if not (is_real(mean) and math.isfinite(mean)):
            raise ValueError(f"a prior's mean is a finite number, got {mean!r}")
        if not (is_real(std) and 0 < std < math.inf):
            raise ValueError(f"a prior's std is a finite number > 0, got {std!r}")
        if not (is_real(correlation) and 0 <= correlation < 1):
            raise ValueError(f"a prior's correlation is a number in [0, 1), got {correlation!r}")
        return cls(tuple(sizes), float(mean), float(std), float(correlation))


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

    def predict_std(self, arm: Strategy, batch_size: int) -> float:
        """Standard deviation of ``predict`` (load + bias, before a round's own noise): how well rounds timed
        ``arm`` near ``batch_size``."""
        row = self._row(arm, batch_size)
        return math.sqrt(max(0.0, sum(w * v * self.cov[i, j] for i, w in row for j, v in row)))

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
        ignored). ValueError naming the entry when ``state`` is not one a filter can hold (``checked_state``)."""
        mean, cov = checked_state(state)
        layout = {str(arm): (start, self._priors[arm]) for arm, (start, _) in self._knots.items()}
        here, there = shared_indices(state["arms"], layout)
        taken = set(here)
        rest = [i for i in range(self.mean.shape[0]) if i not in taken]
        self.mean[here] = mean[there]
        self.cov[np.ix_(here, here)] = cov[np.ix_(there, there)]
        self.cov[np.ix_(here, rest)] = 0.0
        self.cov[np.ix_(rest, here)] = 0.0


def checked_state(state: dict) -> tuple[np.ndarray, np.ndarray]:
    """The mean and covariance of a saved filter (``LogTimeFilter.state``), checked: ValueError naming the entry
    (``times.filter.mean``, ``.cov``, ``.arms``) unless the mean lies within ``MAX_LOG_RESIDUAL``, the covariance is
    a symmetric positive semi-definite matrix of finite entries with positive variances (a filter's never reach 0:
    every round adds drift and noise), every arm's prior is valid and the load (entry 0) and the arms' knots take
    each entry once."""
    where = "times.filter"
    if not isinstance(state, dict) or not isinstance(state.get("arms"), dict):
        raise ValueError(f"{where} must be an object with 'arms', 'mean' and 'cov', got {state!r}"[:300])
    try:
        mean, cov = np.asarray(state["mean"], dtype=float), np.asarray(state["cov"], dtype=float)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{where}: mean and cov must be a list and a square matrix of numbers ({err})") from None
    n = mean.shape[0] if mean.ndim == 1 else -1
    if n < 1 or cov.shape != (n, n):
        raise ValueError(
            f"{where}: a mean of shape {mean.shape} and a covariance of shape {cov.shape}; expected [n], [n, n]"
        )
    within = f" in (-{MAX_LOG_RESIDUAL:g}, {MAX_LOG_RESIDUAL:g})"
    for name, values, bound, words in (("mean", mean, MAX_LOG_RESIDUAL, within), ("cov", cov, math.inf, "")):
        bad = np.argwhere(~(np.abs(values) < bound))  # NaN too
        if bad.size:
            index = "".join(f"[{i}]" for i in bad[0])
            value = float(values[tuple(bad[0])])
            raise ValueError(f"{where}.{name}{index} is {value}: expected a finite number{words}")
    variances = np.diag(cov)
    if variances.min() <= 0:
        i = int(variances.argmin())
        raise ValueError(f"{where}.cov[{i}][{i}] is {float(variances[i])!r}: a variance must be > 0")
    if variances.max() > MAX_LOG_RESIDUAL**2:  # wider than any residual the mean may hold: the update loses precision
        i = int(variances.argmax())
        raise ValueError(
            f"{where}.cov[{i}][{i}] is {float(variances[i])!r}: a variance must be <= {MAX_LOG_RESIDUAL**2:g}"
        )
    scale = np.sqrt(variances)
    correlation = cov / np.outer(scale, scale)  # scale-free: the checks below hold for seconds and for hours
    if not np.allclose(correlation, correlation.T, rtol=0.0, atol=1e-9):
        i, j = np.argwhere(~np.isclose(correlation, correlation.T, rtol=0.0, atol=1e-9))[0]
        raise ValueError(
            f"{where}.cov is not symmetric: [{i}][{j}] = {float(cov[i, j])!r}, [{j}][{i}] = {float(cov[j, i])!r}"
        )
    lowest = float(np.linalg.eigvalsh(correlation).min())
    if lowest < -1e-9:
        raise ValueError(
            f"{where}.cov is not positive semi-definite (its correlation matrix has eigenvalue {lowest:.3g})"
        )
    taken = [0]
    for arm, saved in state["arms"].items():
        if not isinstance(saved, dict) or not is_int(saved.get("start")):
            raise ValueError(f"{where}.arms[{arm!r}] must be {{'start': int, 'prior': [...]}}, got {saved!r}"[:300])
        try:
            prior = ArmPrior.from_state(saved.get("prior"))
        except ValueError as err:
            raise ValueError(f"{where}.arms[{arm!r}].prior: {err}") from None
        start, stop = saved["start"], saved["start"] + len(prior.sizes)
        if start < 1 or stop > n:
            raise ValueError(f"{where}.arms[{arm!r}]: knots {start}..{stop - 1} outside the mean's 1..{n - 1}")
        taken += range(start, stop)
    if sorted(taken) != list(range(n)):
        raise ValueError(f"{where}.arms: the load and the arms' knots must take each of the mean's {n} entries once")
    return mean, cov


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
