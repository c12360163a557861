"""Round wall time per (strategy, batch size): fitted from measured engine timings, or a parametric default.

The parametric default stands for a small (~1-2B) policy on one modern GPU with CUDA graphs: a forward pass costs
about the same for any number of tokens up to a saturation point (memory-bound), then grows linearly with tokens
(compute-bound). A speculative round verifies ``batch_size * num_draft_tokens`` tokens in one policy forward, runs
``steps`` drafter forwards over ``batch_size * topk`` tokens each, and pays a fixed overhead (tree construction,
verification, bookkeeping). A plain round is one policy forward over ``batch_size`` tokens.
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from fastrl.json_values import is_int, is_real
from fastrl.strategy.strategy import DISABLE, Strategy, strategy_entry


@dataclass(frozen=True)
class CostParams:
    """Parameters of the parametric cost model (seconds, tokens)."""

    forward_s: float = 0.006
    """Policy forward over up to ``saturation_tokens`` tokens."""
    saturation_tokens: int = 128
    """Tokens per forward beyond which the policy forward is compute-bound (cost linear in tokens)."""
    draft_step_s: float = 0.0005
    """One drafter forward over up to ``draft_saturation_tokens`` tokens."""
    draft_saturation_tokens: int = 512
    """Tokens per drafter forward beyond which its cost is linear in tokens."""
    spec_overhead_s: float = 0.0008
    """Fixed cost of a speculative round beyond its forwards (tree building, verification, bookkeeping)."""

    def __post_init__(self) -> None:
        for name in ("forward_s", "draft_step_s", "saturation_tokens", "draft_saturation_tokens"):
            if not getattr(self, name) > 0:
                raise ValueError(f"CostParams.{name} must be > 0, got {getattr(self, name)}")
        if self.spec_overhead_s < 0:
            raise ValueError(f"CostParams.spec_overhead_s must be >= 0, got {self.spec_overhead_s}")


@dataclass(frozen=True)
class RoundCost:
    """The parts of one round's wall time (seconds)."""

    draft_s: float
    verify_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        """Round wall time."""
        return self.draft_s + self.verify_s + self.overhead_s


Point = tuple[Strategy, int, float, "int | None"]
"""One measured round time: ``(strategy, batch_size, seconds, context)``, ``context`` the mean keys per row the round
attended over (None: not recorded)."""

COLD = "cold"
"""The fifth field of a JSON row timing a plain round right after another arm's (``CostModel.cold_measurements``)."""


class CostModel:
    """Round wall time per (strategy, batch size), and per context where the measurements say.

    Strategies with measurements use piecewise-linear interpolation in batch size over the median time measured at
    each batch size (constant below the smallest measured batch size, linear extrapolation with a non-negative
    slope above the largest); measured at several contexts, then linear in the context between them (``context_time``).
    Other strategies use ``params`` when given, else raise ``ValueError``.

    ``cold`` times plain rounds right after a round of another arm, where a calibration measured them: on a CPU such
    a round finds the policy's weights and cache partly out of the processor's caches (the other arm's drafter,
    tree and wider activations took their place) and costs more than plain rounds in a row, by more the smaller the
    batch (`RoundTimes` learns plain decoding's price from it as a warm round's).
    """

    def __init__(
        self,
        params: CostParams | None = None,
        tables: dict[Strategy, dict[int | None, list[tuple[int, float]]]] | None = None,
        cold: dict[int | None, list[tuple[int, float]]] | None = None,
    ) -> None:
        self.params = params
        self._tables: dict[Strategy, dict[int | None, tuple[list[int], list[float]]]] = {}
        for strategy, levels in (tables or {}).items():
            self._tables[strategy] = _levels(str(strategy), levels)
        self._cold = _levels("cold plain", cold or {})

    @classmethod
    def default_gpu(cls) -> CostModel:
        """The parametric model of a small policy on one GPU (``CostParams()`` defaults)."""
        return cls(params=CostParams())

    @classmethod
    def fit(cls, measurements: list, fallback: CostParams | None = None, cold: list | None = None) -> CostModel:
        """Build a model from measured rounds, each a ``Point`` or a ``(strategy, batch_size, seconds)`` without a
        context (repeats are reduced to medians); ``cold``: ``Point``s of plain rounds right after another arm's."""
        if not measurements:
            raise ValueError("CostModel.fit needs at least one measurement")
        samples: dict[Strategy, dict[int | None, dict[int, list[float]]]] = defaultdict(
            lambda: defaultdict(lambda: defaultdict(list))
        )
        cold_samples: dict[int | None, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for point in measurements:
            strategy, batch_size, seconds, context = _checked_point(point)
            samples[strategy][context][batch_size].append(seconds)
        for point in cold or []:
            strategy, batch_size, seconds, context = _checked_point(point)
            if not strategy.is_disabled:
                raise ValueError(f"measurement {tuple(point)}: a cold round is a plain one (disable)")
            cold_samples[context][batch_size].append(seconds)
        tables = {strategy: _medians(levels) for strategy, levels in samples.items()}
        return cls(params=fallback, tables=tables, cold=_medians(cold_samples))

    @classmethod
    def from_rows(cls, rows: object, where: str) -> CostModel:
        """The model of JSON rows ``[strategy, batch size, seconds]`` or ``[strategy, batch size, seconds, context]``
        (what ``rows`` writes); ValueError naming ``where`` when they are anything else (``checked_rows``)."""
        try:
            points, cold = checked_rows(rows, "rows")
            return cls.fit(points, cold=cold)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from err

    def rows(self) -> list[list]:
        """The measured table as JSON rows (``from_rows`` reads them back; a point without a context has 3 fields, a
        cold plain round's a fifth, ``COLD``)."""
        rows = [[str(s), b, t] if c is None else [str(s), b, t, c] for s, b, t, c in self.measurements()]
        return rows + [[str(s), b, t, c, COLD] for s, b, t, c in self.cold_measurements()]

    @classmethod
    def from_json(cls, path: str, fallback: CostParams | None = None) -> CostModel:
        """Fit from a JSON list of {"strategy", "batch_size", "seconds"} rounds (`fastrl bench` writes one)."""
        with open(path) as f:
            try:
                rows = json.load(f)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} is not JSON ({err})") from None
        try:
            measurements = [(Strategy.parse(r["strategy"]), int(r["batch_size"]), float(r["seconds"])) for r in rows]
            return cls.fit(measurements, fallback)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}: expected a list of {{strategy, batch_size, seconds}} objects ({err})") from err

    def has_strategy(self, strategy: Strategy) -> bool:
        """True when `round_time` can answer for `strategy`: measured, or a parametric fallback exists (EAGLE arms and
        plain decoding only: a history arm must be measured)."""
        return strategy in self._tables or (self.params is not None and not strategy.is_history)

    @property
    def measured_strategies(self) -> list[Strategy]:
        """Strategies with measured timings."""
        return sorted(self._tables)

    def measurements(self) -> list[Point]:
        """The measured table as ``Point``s (``fit`` rebuilds the same model)."""
        return [
            (s, b, t, c)
            for s, levels in sorted(self._tables.items())
            for c, (sizes, times) in levels.items()
            for b, t in zip(sizes, times, strict=True)
        ]

    def cold_measurements(self) -> list[Point]:
        """The cold plain rounds' table as ``Point``s (``fit``'s ``cold`` rebuilds it; empty where none were timed)."""
        return [
            (DISABLE, b, t, c) for c, (sizes, times) in self._cold.items() for b, t in zip(sizes, times, strict=True)
        ]

    def round_time(self, strategy: Strategy, batch_size: int, context: float | None = None) -> float:
        """Wall time (seconds) of one round of ``strategy`` over ``batch_size`` requests of ``context`` keys a row
        (see ``context_time``)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if strategy in self._tables:
            levels = self._tables[strategy].items()
            return context_time([(c, _interpolate(*table, batch_size)) for c, table in levels], context)
        return self.breakdown(strategy, batch_size).total_s

    def breakdown(self, strategy: Strategy, batch_size: int) -> RoundCost:
        """Draft / verify / overhead parts of a round under the parametric model."""
        if self.params is None:
            raise ValueError(f"no timings for strategy {str(strategy)!r} and no parametric fallback")
        p = self.params
        if strategy.is_disabled:
            return RoundCost(0.0, _forward(p.forward_s, p.saturation_tokens, batch_size), 0.0)
        if strategy.is_history:
            raise ValueError(
                f"no timings for history strategy {str(strategy)!r}: measure it (the parametric model is EAGLE's)"
            )
        verify = _forward(p.forward_s, p.saturation_tokens, batch_size * strategy.num_draft_tokens)
        draft = strategy.steps * _forward(p.draft_step_s, p.draft_saturation_tokens, batch_size * strategy.topk)
        return RoundCost(draft, verify, p.spec_overhead_s)


def checked_rows(rows: object, name: str) -> tuple[list[Point], list[Point]]:
    """The ``Point``s of JSON rows ``[strategy, batch size, seconds(, context)]`` named ``name`` (a bandit state's
    calibration, a cached calibration), and those of its cold plain rounds (``[disable, batch size, seconds, context,
    COLD]``): ValueError naming the first entry that is not one (``name[i][k]``)."""
    if not (isinstance(rows, list) and all(isinstance(r, list) and len(r) in (3, 4, 5) for r in rows)):
        said = f"{name} must be a list of [strategy, batch size, seconds(, context)] rows, got {rows!r}"
        raise ValueError(said[:300])
    points: list[Point] = []
    cold: list[Point] = []
    for i, (strategy, batch_size, seconds, *context) in enumerate(rows):
        arm = strategy_entry(f"{name}[{i}][0]", strategy)
        if len(context) == 2:
            if context[1] != COLD or not arm.is_disabled:
                raise ValueError(
                    f"{name}[{i}] is {rows[i]!r}: rows are [strategy, batch size, seconds(, context)], a cold plain "
                    f"round's [{DISABLE}, batch size, seconds, context, {COLD!r}]"
                )
            context = context[:1]
        for k, count in ((1, batch_size), *((3, c) for c in context)):
            if not is_int(count) or count < 1:
                raise ValueError(
                    f"{name}[{i}][{k}] is {count!r}: expected an integer >= 1 (batch sizes and contexts are integers)"
                )
        if not (is_real(seconds) and 0 < seconds < math.inf):
            raise ValueError(f"{name}[{i}][2] is {seconds!r}: expected a finite number of seconds > 0")
        (cold if len(rows[i]) == 5 else points).append(
            (arm, int(batch_size), float(seconds), int(context[0]) if context else None)
        )
    return points, cold


def context_time(levels: list[tuple[int | None, float]], context: float | None) -> float:
    """Round time at ``context`` keys a row from the times at measured contexts (``levels``, sorted by context): a
    round attends over every row's keys, so its time is linear in the context: between two levels the line through
    them, beyond the longest the last segment's line with a non-negative slope, below the shortest the shortest's
    time. An unknown context (None) is taken as the longest measured, where rollouts spend their rounds; a time
    measured without a context answers for every context."""
    if context is None or len(levels) == 1 or levels[0][0] is None:
        return levels[-1][1]
    contexts = [c for c, _ in levels]
    if context <= contexts[0]:
        return levels[0][1]
    hi = min(bisect.bisect_left(contexts, context), len(levels) - 1)
    (c0, t0), (c1, t1) = levels[hi - 1], levels[hi]
    slope = (t1 - t0) / (c1 - c0)
    if context <= c1:
        return t0 + slope * (context - c0)
    return t1 + max(0.0, slope) * (context - c1)


def _checked_point(point: tuple) -> Point:
    """A measured round as a ``Point`` (one without a context: None); ValueError unless its batch size is >= 1, its
    seconds finite and > 0 and its context None or >= 1."""
    strategy, batch_size, seconds, context = (*point, None) if len(point) == 3 else point
    if batch_size < 1 or not 0 < seconds < math.inf or not (context is None or 1 <= context < math.inf):
        raise ValueError(
            f"measurement {tuple(point)}: batch_size must be >= 1, seconds a finite number > 0 and the "
            "context (mean keys per row) None or >= 1"
        )
    return strategy, batch_size, seconds, context


def _medians(samples: dict[int | None, dict[int, list[float]]]) -> dict[int | None, list[tuple[int, float]]]:
    """Per context, each batch size's median seconds."""
    return {c: [(bs, statistics.median(times)) for bs, times in by_bs.items()] for c, by_bs in samples.items()}


def _levels(
    name: str, levels: dict[int | None, list[tuple[int, float]]]
) -> dict[int | None, tuple[list[int], list[float]]]:
    """One table's ``(sizes, seconds)`` per context, contexts and sizes sorted; ValueError naming ``name`` when it was
    measured both with and without a context."""
    if None in levels and len(levels) > 1:
        raise ValueError(f"strategy {name}: measured both with and without a context")
    table = {}
    for context, points in sorted(levels.items(), key=lambda item: item[0] or 0):
        ordered = sorted(points)
        table[context] = ([bs for bs, _ in ordered], [s for _, s in ordered])
    return table


def _forward(base_s: float, saturation: int, tokens: int) -> float:
    """Flat up to ``saturation`` tokens, linear beyond."""
    return base_s * max(1.0, tokens / saturation)


def _interpolate(sizes: list[int], times: list[float], batch_size: int) -> float:
    if batch_size <= sizes[0]:
        return times[0]
    if batch_size >= sizes[-1]:
        if len(sizes) == 1:
            return times[-1]
        slope = max(0.0, (times[-1] - times[-2]) / (sizes[-1] - sizes[-2]))
        return times[-1] + slope * (batch_size - sizes[-1])
    hi = bisect.bisect_left(sizes, batch_size)
    lo = hi - 1
    frac = (batch_size - sizes[lo]) / (sizes[hi] - sizes[lo])
    return times[lo] + frac * (times[hi] - times[lo])
