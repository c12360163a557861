"""Round wall time per (arm, batch size): a calibration curve, corrected by every round the engine runs.

The calibration (``fastrl.engine.calibration``) times a few rounds of every arm at a few batch sizes at engine
start; between them a knee-shaped curve interpolates (``knee_curve``). Real rounds differ from calibration rounds
(longer contexts, a warm cache, other processes), so each (arm, batch size) run keeps the running log-time of its
rounds, and the prediction is the calibration curve times the measured / calibrated ratio, interpolated between the
sizes the arm ran at (each shrunk toward the arm's overall ratio while it has few rounds, that one toward all arms'
ratio; an arm never run takes the ratio of all arms). Updates move the logs by at most ``MAX_STEP`` so that one
stalled round (a page fault, another process) cannot swing an estimate. Without a calibration an arm's time is
its own measurements, interpolated in batch size; an arm never measured has no time (None).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from fastrl.adaptive.cost_model import CostModel
from fastrl.strategy.strategy import DISABLE, Strategy

MAX_STEP = 0.3
"""Largest change of a log-time or log-ratio from one round."""
RATIO_ALPHA = 0.05
"""EMA weight of one round in an arm's measured / calibrated ratio."""
SIZE_ALPHA = 0.2
"""EMA weight of one round in the log-time of its exact (arm, batch size)."""
CALIBRATION_ROUNDS = 3.0
"""Weight, in rounds, of the corrected calibration against an (arm, batch size)'s own log-time."""


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


class RoundTimes:
    """Predicted seconds of one round of each arm at any batch size (see the module docstring)."""

    def __init__(self, calibration: CostModel | None = None) -> None:
        self._calibration: CostModel | None = None
        self._curves: dict[Strategy, list[tuple[int, float]]] = {}
        self.set_calibration(calibration)
        self.ratio: dict[Strategy, LogMean] = {}
        self.all_ratio = LogMean()
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
        """Learn from one round of ``arm`` over ``batch_size`` rows that took ``seconds``."""
        log_time = math.log(seconds)
        self.sizes.setdefault(arm, {}).setdefault(batch_size, LogMean()).add(log_time, SIZE_ALPHA)
        calibrated = self.calibrated(arm, batch_size)
        if calibrated is not None:
            log_ratio = log_time - math.log(calibrated)
            self.ratio.setdefault(arm, LogMean()).add(log_ratio, RATIO_ALPHA)
            self.all_ratio.add(log_ratio, RATIO_ALPHA)

    def seconds(self, arm: Strategy, batch_size: int) -> float | None:
        """Predicted wall time of one round (None when ``arm`` was neither calibrated nor measured)."""
        calibrated = self.calibrated(arm, batch_size)
        if calibrated is None:
            return self._interpolated(arm, batch_size)
        return calibrated * math.exp(self._log_ratio(arm, batch_size))

    def plain_seconds(self, batch_size: int) -> float | None:
        """Predicted wall time of one plain round."""
        return self.seconds(DISABLE, batch_size)

    def _log_ratio(self, arm: Strategy, batch_size: int) -> float:
        """log(measured / calibrated) at ``batch_size``: linear between the nearest sizes the arm ran at (each
        size's own ratio, shrunk toward the arm's over ``CALIBRATION_ROUNDS`` rounds), the nearest outside them;
        the arm's ratio (all arms' for an arm never run) where it ran at no size."""
        ratio = self.ratio.get(arm)
        overall = self.all_ratio.value
        if ratio is not None:  # the arm's own ratio, shrunk toward all arms' while it has few rounds
            weight = min(ratio.count, 1.0 / RATIO_ALPHA)
            overall = (weight * ratio.value + CALIBRATION_ROUNDS * overall) / (weight + CALIBRATION_ROUNDS)
        measured = self.sizes.get(arm)
        if not measured:
            return overall
        sizes = sorted(measured)

        def at(size: int) -> float:
            own = measured[size]
            weight = min(own.count, 1.0 / SIZE_ALPHA)
            log_ratio = own.value - math.log(self.calibrated(arm, size))
            return (weight * log_ratio + CALIBRATION_ROUNDS * overall) / (weight + CALIBRATION_ROUNDS)

        i = bisect.bisect_left(sizes, batch_size)
        if i < len(sizes) and sizes[i] == batch_size:
            return at(batch_size)
        if i == 0 or i == len(sizes):
            return at(sizes[min(i, len(sizes) - 1)])
        lo, hi = sizes[i - 1], sizes[i]
        frac = (batch_size - lo) / (hi - lo)
        return (1 - frac) * at(lo) + frac * at(hi)

    def _interpolated(self, arm: Strategy, batch_size: int) -> float | None:
        """Linear in batch size between the arm's measured sizes; the nearest one outside them."""
        measured = self.sizes.get(arm)
        if not measured:
            return None
        sizes = sorted(measured)
        i = bisect.bisect_left(sizes, batch_size)
        if i == 0 or i == len(sizes):
            return math.exp(measured[sizes[min(i, len(sizes) - 1)]].value)
        lo, hi = sizes[i - 1], sizes[i]
        frac = (batch_size - lo) / (hi - lo)
        return (1 - frac) * math.exp(measured[lo].value) + frac * math.exp(measured[hi].value)

    def state(self) -> dict:
        """Plain-data snapshot of what rounds taught (the calibration is saved on its own)."""
        return {
            "ratio": {str(a): [m.value, m.count] for a, m in self.ratio.items()},
            "all_ratio": [self.all_ratio.value, self.all_ratio.count],
            "sizes": {str(a): [[b, m.value, m.count] for b, m in sorted(s.items())] for a, s in self.sizes.items()},
        }

    def load(self, state: dict) -> None:
        """Restore ``state`` (arms outside it start unmeasured)."""
        self.ratio = {Strategy.parse(a): LogMean(float(v), int(n)) for a, (v, n) in state["ratio"].items()}
        self.all_ratio = LogMean(float(state["all_ratio"][0]), int(state["all_ratio"][1]))
        self.sizes = {
            Strategy.parse(a): {int(b): LogMean(float(v), int(n)) for b, v, n in rows}
            for a, rows in state["sizes"].items()
        }
