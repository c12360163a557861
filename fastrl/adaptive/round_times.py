"""Round wall time per (arm, batch size): a calibration curve, times the machine's current load, times a per-arm bias.

The calibration (``fastrl.engine.calibration``) times a few rounds of every arm at a few batch sizes at engine
start, at a short and a long context; between the sizes a knee-shaped curve interpolates (``knee_curve``), between
the contexts a line (``context_time``), at the context of the last round learned (``context_bin`` of its keys per
row: a rollout's contexts grow a token a round, and plain rounds at batch 64 on this CPU took 6.4 ms at 34 keys a
row, 15 ms at 430, where a ``5_1_6`` round took 6.0x and 5.0x a plain one). A shared machine's round times swing 2-3x
with its load within minutes, and a calibration may be stale (cached from a run under another load), so the time of
one round is modelled as ``log t(arm, b, now) = log calibrated(arm, b, context) + load(now) + bias(arm, b)``,
estimated by a Kalman filter over every round run (``LogTimeFilter``):

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

A plain round right after another arm's is learned as the plain round after plain rounds it stands for
(``warm_seconds``): on a CPU it finds less of the policy in the processor's caches (a ``3_1_4`` round's drafter, tree
and wider activations took their place), and a plain anchor among speculative rounds, the bandit's one measure of
plain decoding at the tail's small batches, is such a round. Learned as it is, it priced plain decoding ~15% above
what a plain run pays there (the bundled model at batch 1) and put ``fastrl train``'s speedup estimate as much too
high. The calibration times the penalty per batch size and context (its cold plain rounds, ``cold_penalty``).

Comparisons between arms at one moment then cancel the load. An arm without a calibration is timed by its own rounds
(its "calibration" is 1 s and its bias a wide prior over knots at ``UNCALIBRATED_SIZES``); an arm neither calibrated
nor measured has no time (None).
"""

from __future__ import annotations

import bisect
import math

from fastrl.adaptive.chain_depth import ChainCurve, ChainRounds, fixed_chains
from fastrl.adaptive.cost_model import CostModel, context_time
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
TIMED_LOG_STD = 0.5
"""Largest spread of an uncalibrated arm's predicted log time at a batch size before a round there times it: rounds
at batch 64 leave its time at batch 1 within ~1.8 (a factor of 6: the prior's correlation between knots), where
one round at batch 1 brings it near the round noise (``time_filter.ROUND_STD``)."""
CONTEXT_STEPS = 16
"""Context bins per doubling (``context_bin``): a round's time moves by under 2% within one."""
CONTEXT_STEP_KEYS = 8
"""The finest context bin, in keys a row (below 128 keys, where a doubling's 16th is under 8 keys): predictions made
afresh every round of a short context cost the bandit more than its rounds' differences."""


def context_bin(mean_context: float | None) -> float | None:
    """The context a prediction takes for a round of ``mean_context`` keys a row: rounded to ``CONTEXT_STEPS``
    steps a doubling, and to ``CONTEXT_STEP_KEYS`` keys where those are finer, so that the predictions hold for many
    rounds of a growing context (None stays None)."""
    if mean_context is None:
        return None
    fine = CONTEXT_STEP_KEYS * CONTEXT_STEPS / math.log(2.0)  # where a step of the log grid is CONTEXT_STEP_KEYS
    if mean_context < fine:
        return float(max(CONTEXT_STEP_KEYS, CONTEXT_STEP_KEYS * round(mean_context / CONTEXT_STEP_KEYS)))
    step = round(CONTEXT_STEPS * math.log2(mean_context))
    if 2.0 ** (step / CONTEXT_STEPS) < fine:  # the log grid's point below the switch: the next one, the bin of itself
        step += 1
    return 2.0 ** (step / CONTEXT_STEPS)


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
        self._curves: dict[Strategy, dict[int | None, list[tuple[int, float]]]] = {}  # per arm, per context
        self._context: float | None = None  # the context of predictions (the last round learned: ``context_bin``)
        self._filter = LogTimeFilter(LOAD_STD)
        self._measured: set[Strategy] = set()
        self._fixed: dict[Strategy, list[Strategy]] = {}  # stopping chain -> the fixed chains that time it
        self._curves_by_depth: dict[tuple[Strategy, int], ChainCurve | None] = {}
        # choose() asks for every arm's time each round: the calibrated curves' values until another calibration or
        # context bin, the predictions until the next round is learned
        self._curve: dict[tuple[Strategy, int], float | None] = {}
        self._predicted: dict[tuple[Strategy, int], float | None] = {}
        self._cold: dict[int | None, list[tuple[int, float]]] = {}  # the calibration's cold plain rounds, per context
        self._penalty: dict[int, float] = {}  # cold_penalty per batch size, at the current context
        self.set_calibration(calibration)

    def calibration(self) -> CostModel | None:
        """The calibration in use (None before one is given)."""
        return self._calibration

    def set_calibration(self, calibration: CostModel | None) -> None:
        """Use ``calibration``; what rounds taught against another calibration is dropped."""
        self._calibration = calibration
        self._clear_predictions()
        self._curves, self._cold = {}, {}
        for arm, size, seconds, context in calibration.measurements() if calibration is not None else []:
            self._curves.setdefault(arm, {}).setdefault(context, []).append((size, seconds))
        for _, size, seconds, context in calibration.cold_measurements() if calibration is not None else []:
            self._cold.setdefault(context, []).append((size, seconds))
        calibrated = list(self._curves)
        stopping = [arm for arm in calibrated if arm.stops_early and self._chain_depth]
        self._fixed = {arm: fixed_chains(arm, calibrated) for arm in stopping}
        self._filter = LogTimeFilter(LOAD_STD)
        self._measured = set()
        for arm, levels in self._curves.items():
            sizes = tuple(sorted({b for points in levels.values() for b, _ in points}))
            std = PLAIN_BIAS_STD if arm.is_disabled else BIAS_STD
            self._filter.add(arm, ArmPrior(sizes, 0.0, std, BIAS_CORRELATION))

    @property
    def context(self) -> float | None:
        """The context (keys a row) predictions are made at: the last round learned's, binned (None before any)."""
        return self._context

    def set_context(self, mean_context: float | None) -> None:
        """Predict rounds of ``mean_context`` keys a row from now on (None: unknown, see ``context_time``)."""
        context = context_bin(mean_context)
        if context != self._context:
            self._context = context
            self._clear_predictions()

    def _clear_predictions(self) -> None:
        """Forget every value that depends on the calibration or the context."""
        self._curve.clear()
        self._predicted.clear()
        self._curves_by_depth.clear()
        self._penalty.clear()

    def has_calibration(self, arm: Strategy) -> bool:
        """Whether the calibration timed ``arm`` (``calibrated`` is then a number at every batch size)."""
        return arm in self._curves

    def has_measured(self, arm: Strategy) -> bool:
        """Whether rounds of ``arm`` were timed (by this run, or by the run whose state was loaded)."""
        return arm in self._measured

    def calibrated(self, arm: Strategy, batch_size: int) -> float | None:
        """The calibration curve at ``batch_size`` and the current context (None without a calibration of ``arm``),
        see ``knee_curve`` and ``context_time``."""
        key = (arm, batch_size)
        if key not in self._curve:
            levels = self._curves.get(arm)
            self._curve[key] = None if levels is None else self._at_context(levels, batch_size)
        return self._curve[key]

    def _at_context(self, levels: dict[int | None, list[tuple[int, float]]], batch_size: int) -> float:
        """A calibrated time at ``batch_size`` and the current context, from its ``(size, seconds)`` points per
        measured context (``knee_curve`` between the sizes, ``context_time`` between the contexts)."""
        return context_time([(c, knee_curve(points, batch_size)) for c, points in levels.items()], self._context)

    def cold_penalty(self, batch_size: int) -> float:
        """How many times longer a plain round right after another arm's takes than one after plain rounds, at
        ``batch_size`` and the current context: the calibration's cold plain rounds over its plain ones (at least 1;
        1 where it timed none)."""
        if batch_size not in self._penalty:
            plain = self.calibrated(DISABLE, batch_size)
            if not self._cold or plain is None:
                self._penalty[batch_size] = 1.0
            else:
                self._penalty[batch_size] = max(1.0, self._at_context(self._cold, batch_size) / plain)
        return self._penalty[batch_size]

    def warm_seconds(self, stats: RoundStats) -> float:
        """A round's own time (``RoundStats.own_time_s``), a cold plain round's (right after another arm's) as the
        plain round after plain rounds it stands for (over ``cold_penalty``), at its batch size and context."""
        self.set_context(stats.mean_context)
        if stats.strategy.is_disabled and stats.after_other_arm:
            return stats.own_time_s / self.cold_penalty(stats.batch_size)
        return stats.own_time_s

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
        depth = stats.stopped_depth
        if depth is not None and self._chain_depth:
            self.chains.observe(stats.strategy, stats.batch_size, depth, stats.total_emitted / stats.batch_size)
        self.observe(stats.strategy, stats.batch_size, self.warm_seconds(stats), depth)

    def plain_estimate(self, stats: RoundStats) -> float:
        """Seconds plain decoding would have taken for a round's tokens: its own time for a plain round (less a
        drafter catch-up it ran, as a warm round's: ``warm_seconds``), else the plain round time at its batch size and
        context now x the tokens emitted per row (0.0 while plain's time is unknown). Predictions are made at its
        context from then on."""
        if stats.strategy.is_disabled:
            return self.warm_seconds(stats)
        self.set_context(stats.mean_context)
        seconds = self.plain_seconds(stats.batch_size)
        return 0.0 if seconds is None else seconds * stats.total_emitted / stats.batch_size

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

    def log_std(self, arm: Strategy, batch_size: int) -> float | None:
        """Standard deviation of the log of ``seconds(arm, batch_size)`` (None where ``arm`` has no time curve): an
        uncalibrated arm's stays near its prior's spread far from the batch sizes its rounds were timed at."""
        return self._filter.predict_std(arm, batch_size) if self._filter.has(arm) else None

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
            points = [(c.steps, self.calibrated(c, batch_size)) for c in chains]
            self._curves_by_depth[key] = ChainCurve.fit(points)
        return self._curves_by_depth[key]

    def _log_expected(self, arm: Strategy, batch_size: int) -> float:
        """Log of the calibrated time of a round now: a stopping chain's at the depth it is expected to reach."""
        depth = self.depth(arm, batch_size)
        if depth is None:
            return self._log_calibrated(arm, batch_size)
        return math.log(self._depth_curve(arm, batch_size).seconds(depth))  # type: ignore[union-attr]

    def _log_calibrated(self, arm: Strategy, batch_size: int) -> float:
        calibrated = self.calibrated(arm, batch_size)
        return 0.0 if calibrated is None else math.log(calibrated)

    def state(self) -> dict:
        """Plain-data snapshot of what rounds taught (the calibration is saved on its own)."""
        measured = sorted(str(a) for a in self._measured)
        return {"filter": self._filter.state(), "measured": measured, "context": self._context}

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
        self.set_context(state.get("context"))  # absent from states saved before contexts were learned
