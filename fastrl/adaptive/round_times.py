"""Round wall time per (arm, batch size): a calibration curve, times the machine's current load, times a slow per-arm
bias.

The calibration (``fastrl.engine.calibration``) times a few rounds of every arm at a few batch sizes at engine
start; between them a knee-shaped curve interpolates (``knee_curve``). A shared machine's round times swing 2-3x
with its load within minutes, and a calibration may be stale (cached from a run under another load), so the time of
one round is modelled as ``log t(arm, b, now) = log calibrated(arm, b) + load(now) + bias(arm, b)``:

* ``load`` is one fast-moving term shared by every arm, learned from every round's residual whatever arm ran (an
  EMA with weight ``LOAD_ALPHA``). A uniformly stale calibration is absorbed here within a few rounds.
* ``bias(arm, b)`` is what the calibration got wrong about one arm relative to the others (real contexts are longer
  than the calibration's, a drafter round costs more beside a long cache): a slow mean of the residuals left after
  removing the load of the moment, kept per (arm, batch size) and interpolated between the sizes the arm ran at,
  each size's mean shrunk toward the arm's overall one, that one toward 0 with ``BIAS_PRIOR_ROUNDS`` rounds of
  weight (the calibration is trusted until rounds say otherwise).

Comparisons between arms at one moment then cancel the load, and the plain-time estimate follows the machine's
current state. Updates move a log by at most ``MAX_STEP`` so that one stalled round cannot swing an estimate. An
arm without a calibration is timed by its own rounds alone (its "calibration" is 1 s and its bias has no prior);
an arm neither calibrated nor measured has no time (None).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from fastrl.adaptive.cost_model import CostModel
from fastrl.strategy.strategy import DISABLE, Strategy

MAX_STEP = 0.3
"""Largest change of a log-time, log-load or log-bias from one round."""
LOAD_ALPHA = 0.2
"""EMA weight of one round in the shared load: it follows the machine within a few rounds."""
BIAS_ALPHA = 0.05
"""EMA weight of one round in an arm's bias (after its first ``1 / BIAS_ALPHA`` rounds, a plain mean before)."""
BIAS_PRIOR_ROUNDS = 8.0
"""Weight, in rounds, of the calibration's own word (bias 0) against an arm's measured bias."""
ERROR_CLIP = 1.0
"""Largest log-error of one round against its prediction that is learned from (a stalled round counts as e x)."""
SIZE_ROUNDS = 3.0
"""Weight, in rounds, of the arm's overall bias against one batch size's own mean."""


def calibration_sizes(max_batch_size: int) -> list[int]:
    """Batch sizes a calibration times: 1, 8, 64, ... below ``max_batch_size``, and ``max_batch_size`` itself."""
    sizes, b = [], 1
    while b < max_batch_size:
        sizes.append(b)
        b *= 8
    return sizes + [max_batch_size]


def knee_curve(points: list[tuple[int, float]], batch_size: int) -> float:
    """Round time at ``batch_size`` from measured ``(batch size, seconds)`` points (sorted by size).

    A forward costs about the same for any number of tokens up to a knee, then grows linearly, so between two
    measured sizes the time is the larger of the left point (flat) and the line through the next two points
    (linear), never above the straight line between the two (which overestimates a flat-then-linear cost); below
    the smallest size, the smallest's time; above the largest, the last segment's line with a non-negative slope.
    """
    sizes = [b for b, _ in points]
    times = [t for _, t in points]
    if batch_size <= sizes[0] or len(sizes) == 1:
        return times[0] if batch_size <= sizes[0] else times[-1]
    i = bisect.bisect_left(sizes, batch_size)
    if i == len(sizes):
        slope = max(0.0, (times[-1] - times[-2]) / (sizes[-1] - sizes[-2]))
        return times[-1] + slope * (batch_size - sizes[-1])
    if sizes[i] == batch_size:
        return times[i]
    lo, hi = i - 1, i
    chord = times[lo] + (batch_size - sizes[lo]) / (sizes[hi] - sizes[lo]) * (times[hi] - times[lo])
    if hi + 1 == len(sizes):
        return chord
    slope = max(0.0, (times[hi + 1] - times[hi]) / (sizes[hi + 1] - sizes[hi]))
    return min(chord, max(times[lo], times[hi] - slope * (sizes[hi] - batch_size)))


@dataclass
class LogMean:
    """A running mean of logs (EMA after the first ``1 / alpha`` values, plain mean before), steps clipped."""

    value: float = 0.0
    count: int = 0

    def add(self, log_value: float, alpha: float) -> None:
        self.count += 1
        step = (log_value - self.value) * max(alpha, 1.0 / self.count)
        self.value += step if self.count == 1 else max(-MAX_STEP, min(MAX_STEP, step))

    def state(self) -> list:
        return [self.value, self.count]


class RoundTimes:
    """Predicted seconds of one round of each arm at any batch size (see the module docstring)."""

    def __init__(self, calibration: CostModel | None = None) -> None:
        self._calibration: CostModel | None = None
        self._curves: dict[Strategy, list[tuple[int, float]]] = {}
        self.set_calibration(calibration)
        self.load = LogMean()
        self.bias: dict[Strategy, LogMean] = {}
        self.sizes: dict[Strategy, dict[int, LogMean]] = {}

    def calibration(self) -> CostModel | None:
        """The calibration in use (None before one is given)."""
        return self._calibration

    def set_calibration(self, calibration: CostModel | None) -> None:
        """Use ``calibration`` (what rounds taught keeps correcting it)."""
        self._calibration = calibration
        self._curves = {}
        for arm, size, seconds in calibration.measurements() if calibration is not None else []:
            self._curves.setdefault(arm, []).append((size, seconds))

    def calibrated(self, arm: Strategy, batch_size: int) -> float | None:
        """The calibration curve at ``batch_size`` (None without a calibration of ``arm``), see ``knee_curve``."""
        points = self._curves.get(arm)
        return None if points is None else knee_curve(points, batch_size)

    def observe(self, arm: Strategy, batch_size: int, seconds: float) -> None:
        """Learn from one round of ``arm`` over ``batch_size`` rows that took ``seconds``: its error against the
        prediction (at most ``ERROR_CLIP`` in log) moves the load first, and what the moved load leaves of it moves
        the arm's bias (an arm without a calibration moves only its own)."""
        target = self._bias(arm, batch_size)
        error = math.log(seconds) - self._log_calibrated(arm, batch_size) - self.load.value - target
        if arm in self._curves:
            error = max(-ERROR_CLIP, min(ERROR_CLIP, error))
            before = self.load.value
            self.load.add(before + error, LOAD_ALPHA)
            error -= self.load.value - before
        self.bias.setdefault(arm, LogMean()).add(target + error, BIAS_ALPHA)
        self.sizes.setdefault(arm, {}).setdefault(batch_size, LogMean()).add(target + error, BIAS_ALPHA)

    def seconds(self, arm: Strategy, batch_size: int) -> float | None:
        """Predicted wall time of one round now (None when ``arm`` was neither calibrated nor measured)."""
        if arm not in self._curves and not self.sizes.get(arm):
            return None
        return math.exp(self._log_calibrated(arm, batch_size) + self.load.value + self._bias(arm, batch_size))

    def plain_seconds(self, batch_size: int) -> float | None:
        """Predicted wall time of one plain round now."""
        return self.seconds(DISABLE, batch_size)

    def _log_calibrated(self, arm: Strategy, batch_size: int) -> float:
        calibrated = self.calibrated(arm, batch_size)
        return 0.0 if calibrated is None else math.log(calibrated)

    def _bias(self, arm: Strategy, batch_size: int) -> float:
        """log(time / (calibrated x load)) at ``batch_size``: linear between the nearest sizes the arm ran at (each
        size's own mean shrunk toward the arm's over ``SIZE_ROUNDS`` rounds), the nearest outside them; the arm's
        own mean (shrunk toward 0 over ``BIAS_PRIOR_ROUNDS`` while calibrated) where it ran at no size."""
        own = self.bias.get(arm)
        if own is None:
            return 0.0
        prior = BIAS_PRIOR_ROUNDS if arm in self._curves else 0.0
        weight = min(own.count, 1.0 / BIAS_ALPHA)
        overall = weight * own.value / (weight + prior)
        measured = self.sizes[arm]
        sizes = sorted(measured)

        def at(size: int) -> float:
            mean = measured[size]
            weight = min(mean.count, 1.0 / BIAS_ALPHA)
            return (weight * mean.value + SIZE_ROUNDS * overall) / (weight + SIZE_ROUNDS)

        i = bisect.bisect_left(sizes, batch_size)
        if i < len(sizes) and sizes[i] == batch_size:
            return at(batch_size)
        if i == 0 or i == len(sizes):
            return at(sizes[min(i, len(sizes) - 1)])
        lo, hi = sizes[i - 1], sizes[i]
        frac = (batch_size - lo) / (hi - lo)
        return (1 - frac) * at(lo) + frac * at(hi)

    def state(self) -> dict:
        """Plain-data snapshot of what rounds taught (the calibration is saved on its own)."""
        return {
            "load": self.load.state(),
            "bias": {str(a): m.state() for a, m in self.bias.items()},
            "sizes": {str(a): [[b, m.value, m.count] for b, m in sorted(s.items())] for a, s in self.sizes.items()},
        }

    def load_state(self, state: dict) -> None:
        """Restore ``state`` (arms outside it start unmeasured)."""
        self.load = LogMean(float(state["load"][0]), int(state["load"][1]))
        self.bias = {Strategy.parse(a): LogMean(float(v), int(n)) for a, (v, n) in state["bias"].items()}
        self.sizes = {
            Strategy.parse(a): {int(b): LogMean(float(v), int(n)) for b, v, n in rows}
            for a, rows in state["sizes"].items()
        }
