"""Round wall time per (arm, batch size): a calibration curve, times the machine's current load, times a per-arm bias.

The calibration (``fastrl.engine.calibration``) times a few rounds of every arm at a few batch sizes at engine
start; between them a knee-shaped curve interpolates (``knee_curve``). A shared machine's round times swing 2-3x
with its load within minutes, and a calibration may be stale (cached from a run under another load), so the time of
one round is modelled as ``log t(arm, b, now) = log calibrated(arm, b) + load(now) + bias(arm, b)``, estimated by a
Kalman filter over every round run (``LogTimeFilter``):

* ``load`` is shared by every arm and moves from round to round, so the plain-time estimate follows the machine's
  current state.
* ``bias(arm, b)`` is what the calibration got wrong about one arm (real contexts are longer than the calibration's,
  a drafter round costs more beside a long cache), a curve through knots at the arm's calibration sizes, trusted to
  ``BIAS_STD`` before rounds say otherwise; plain's to ``PLAIN_BIAS_STD``, tighter: plain is what every speedup is
  measured against, so a residual every arm shares is the load before it is plain's bias, and a plain anchor's
  deviation from the others persists in plain's own bias (the load forgets it within tens of rounds).

A stopping chain (``S_1_N@P``) is timed at the depth it reaches (``chain_depth``): a round that drafted ``d`` levels
is compared with the curve through the calibrated fixed chains at ``d`` (``ChainCurve``), and a prediction takes the
depth its rounds reached at that batch size; its bias is then what the curve misses, not the depth.

Comparisons between arms at one moment then cancel the load. An arm without a calibration is timed by its own rounds
(its "calibration" is 1 s and its bias a wide prior over knots at ``UNCALIBRATED_SIZES``); an arm neither calibrated
nor measured has no time (None).
"""

from __future__ import annotations

import bisect
import math

from fastrl.adaptive.chain_depth import ChainCurve, ChainRounds, fixed_chains
from fastrl.adaptive.cost_model import CostModel
from fastrl.adaptive.time_filter import ArmPrior, LogTimeFilter
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy

LOAD_STD = 1.0
"""Prior spread of the load's log: a calibration taken under another load may be e x off."""
BIAS_STD = 0.15
"""Prior spread of a calibrated arm's bias (the calibration's ratio to plain trusted to ~15%)."""
PLAIN_BIAS_STD = 0.1
"""Prior spread of plain's bias. 0 (plain the reference, its residual the load) put `fastrl train`'s plain-time
estimate 13% high: between plain anchors the load took the speculative arms' calibration errors. 0.1 keeps a 2x
warm-up round from bending the ratio between arms by more than 0.2% (the fixed-rate rule: 24%)."""
BIAS_CORRELATION = 0.5
"""Prior correlation of one arm's bias at two of its calibration sizes."""
UNCALIBRATED_SIZES = (1, 8, 64, 512)
"""Knots of the time curve of an arm without a calibration."""
UNCALIBRATED_STD = 4.0
"""Prior spread of an uncalibrated arm's log seconds (around 1 s: anything from 20 ms to 50 s is plausible)."""
UNCALIBRATED_CORRELATION = 0.9
"""Prior correlation of an uncalibrated arm's log time at two of its knots."""
UNCALIBRATED = ArmPrior(UNCALIBRATED_SIZES, 0.0, UNCALIBRATED_STD, UNCALIBRATED_CORRELATION)
"""The time curve an arm without a calibration starts from."""


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


class RoundTimes:
    """Predicted seconds of one round of each arm at any batch size (see the module docstring); ``chain_depth``
    False times stopping chains as any arm."""

    def __init__(
        self, calibration: CostModel | None = None, chain_depth: bool = True, chains: ChainRounds | None = None
    ) -> None:
        self._chain_depth = chain_depth  # time stopping chains at their depth (else as any arm)
        self.chains = chains if chains is not None else ChainRounds()
        """Depths the stopping chains reached (the owner records rounds in it; kept across calibrations)."""
        self._calibration: CostModel | None = None
        self._curves: dict[Strategy, list[tuple[int, float]]] = {}
        self._filter = LogTimeFilter(LOAD_STD)
        self._measured: set[Strategy] = set()
        self._fixed: dict[Strategy, list[Strategy]] = {}  # stopping chain -> the fixed chains that time it
        self._curves_by_depth: dict[tuple[Strategy, int], ChainCurve | None] = {}
        # choose() asks for every arm's time each round: the calibrated curves' values until another calibration,
        # the predictions until the next round is learned
        self._log_curve: dict[tuple[Strategy, int], float] = {}
        self._predicted: dict[tuple[Strategy, int], float | None] = {}
        self.set_calibration(calibration)

    def calibration(self) -> CostModel | None:
        """The calibration in use (None before one is given)."""
        return self._calibration

    def set_calibration(self, calibration: CostModel | None) -> None:
        """Use ``calibration``; what rounds taught against another calibration is dropped."""
        self._calibration = calibration
        self._log_curve.clear()
        self._predicted.clear()
        self._curves_by_depth.clear()
        self._curves = {}
        for arm, size, seconds in calibration.measurements() if calibration is not None else []:
            self._curves.setdefault(arm, []).append((size, seconds))
        calibrated = list(self._curves)
        stopping = [arm for arm in calibrated if arm.stops_early and self._chain_depth]
        self._fixed = {arm: fixed_chains(arm, calibrated) for arm in stopping}
        self._filter = LogTimeFilter(LOAD_STD)
        self._measured = set()
        for arm, points in self._curves.items():
            sizes = tuple(b for b, _ in points)
            std = PLAIN_BIAS_STD if arm.is_disabled else BIAS_STD
            self._filter.add(arm, ArmPrior(sizes, 0.0, std, BIAS_CORRELATION))

    def calibrated(self, arm: Strategy, batch_size: int) -> float | None:
        """The calibration curve at ``batch_size`` (None without a calibration of ``arm``), see ``knee_curve``."""
        points = self._curves.get(arm)
        return None if points is None else knee_curve(points, batch_size)

    def observe(self, arm: Strategy, batch_size: int, seconds: float, depth: int | None = None) -> None:
        """Learn from one round of ``arm`` over ``batch_size`` rows that took ``seconds`` (a stopping chain's:
        after drafting ``depth`` levels)."""
        self._predicted.clear()
        if not self._filter.has(arm):
            self._filter.add(arm, UNCALIBRATED)
        curve = self._depth_curve(arm, batch_size) if depth is not None else None
        expected = math.log(curve.seconds(depth)) if curve is not None else self._log_calibrated(arm, batch_size)
        self._filter.observe(arm, batch_size, math.log(seconds) - expected)
        self._measured.add(arm)

    def observe_round(self, stats: RoundStats) -> None:
        """Learn from one engine round: its time without its ``catch_up_time_s`` (the history index, or after rounds
        without the drafter the drafter, catching up on text emitted before it: a drafter arm pulled among plain
        rounds would otherwise be timed by its catch-ups, or, were they left out, never); a stopping chain's at the
        depth it drafted, that depth and its tokens per row recorded in ``chains``."""
        depth = stats.drafted_tokens[0] if stats.strategy.stops_early and stats.drafted_tokens else None
        if depth is not None and self._chain_depth:
            self.chains.observe(stats.strategy, stats.batch_size, depth, stats.total_emitted / stats.batch_size)
        self.observe(stats.strategy, stats.batch_size, stats.wall_time_s - stats.catch_up_time_s, depth)

    def plain_estimate(self, strategy: Strategy, batch_size: int, emitted: list[int], wall_time_s: float) -> float:
        """Seconds plain decoding would have taken for a round's tokens: its own time for a plain round, else the
        plain round time at this batch size now x the tokens emitted per row (0.0 while plain's time is unknown)."""
        if strategy.is_disabled:
            return wall_time_s
        seconds = self.plain_seconds(batch_size)
        return 0.0 if seconds is None else seconds * sum(emitted) / batch_size

    def seconds(self, arm: Strategy, batch_size: int) -> float | None:
        """Predicted wall time of one round now (None when ``arm`` was neither calibrated nor measured)."""
        key = (arm, batch_size)
        if key not in self._predicted:
            if arm in self._curves or arm in self._measured:
                log_seconds = self._log_expected(arm, batch_size) + self._filter.predict(arm, batch_size)
                self._predicted[key] = math.exp(log_seconds)
            else:
                self._predicted[key] = None
        return self._predicted[key]

    def plain_seconds(self, batch_size: int) -> float | None:
        """Predicted wall time of one plain round now."""
        return self.seconds(DISABLE, batch_size)

    def depth(self, arm: Strategy, batch_size: int) -> float | None:
        """The depth a round of stopping chain ``arm`` is expected to reach at ``batch_size`` (what its rounds
        reached there, else where its calibrated time puts it on the curve); None for other arms, or where the
        calibration has no curve of fixed chains to time it by."""
        curve = self._depth_curve(arm, batch_size)
        if curve is None:
            return None
        learned = self.chains.depth(arm, batch_size)
        return learned if learned is not None else curve.depth_at(self.calibrated(arm, batch_size), arm.steps)

    def _depth_curve(self, arm: Strategy, batch_size: int) -> ChainCurve | None:
        """Seconds per depth of a stopping chain at ``batch_size``, through its fixed chains' calibrated times."""
        key = (arm, batch_size)
        if key not in self._curves_by_depth:
            chains = self._fixed.get(arm, [])
            points = [(c.steps, knee_curve(self._curves[c], batch_size)) for c in chains]
            self._curves_by_depth[key] = ChainCurve.fit(points)
        return self._curves_by_depth[key]

    def _log_expected(self, arm: Strategy, batch_size: int) -> float:
        """Log of the calibrated time of a round now: a stopping chain's at the depth it is expected to reach."""
        depth = self.depth(arm, batch_size)
        if depth is None:
            return self._log_calibrated(arm, batch_size)
        return math.log(self._depth_curve(arm, batch_size).seconds(depth))  # type: ignore[union-attr]

    def _log_calibrated(self, arm: Strategy, batch_size: int) -> float:
        key = (arm, batch_size)
        if key not in self._log_curve:
            calibrated = self.calibrated(arm, batch_size)
            self._log_curve[key] = 0.0 if calibrated is None else math.log(calibrated)
        return self._log_curve[key]

    def state(self) -> dict:
        """Plain-data snapshot of what rounds taught (the calibration is saved on its own)."""
        return {"filter": self._filter.state(), "measured": sorted(str(a) for a in self._measured)}

    def load_state(self, state: dict) -> None:
        """Restore ``state``: the load, and the curves of the arms it shares with this model (an arm calibrated
        here and there at the same sizes; an uncalibrated arm it measured); other arms start from their priors."""
        self._predicted.clear()
        saved = state["filter"]
        for name, arm_state in saved["arms"].items():
            arm, prior = Strategy.parse(name), ArmPrior.from_state(arm_state["prior"])
            if prior == UNCALIBRATED and arm not in self._curves and not self._filter.has(arm):
                self._filter.add(arm, prior)
        self._filter.load(saved)
        known = {Strategy.parse(a) for a in state["measured"]}
        self._measured = {a for a in known if a in self._curves or self._filter.has(a)}
