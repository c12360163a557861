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

from fastrl.strategy.strategy import Strategy


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


class CostModel:
    """Round wall time per (strategy, batch size).

    Strategies with measurements use piecewise-linear interpolation in batch size over the median time measured at
    each batch size (constant below the smallest measured batch size, linear extrapolation with a non-negative
    slope above the largest). Other strategies use ``params`` when given, else raise ``ValueError``.
    """

    def __init__(
        self,
        params: CostParams | None = None,
        tables: dict[Strategy, list[tuple[int, float]]] | None = None,
    ) -> None:
        self.params = params
        self._tables: dict[Strategy, tuple[list[int], list[float]]] = {}
        for strategy, points in (tables or {}).items():
            ordered = sorted(points)
            self._tables[strategy] = ([bs for bs, _ in ordered], [s for _, s in ordered])

    @classmethod
    def default_gpu(cls) -> CostModel:
        """The parametric model of a small policy on one GPU (``CostParams()`` defaults)."""
        return cls(params=CostParams())

    @classmethod
    def fit(cls, measurements: list[tuple[Strategy, int, float]], fallback: CostParams | None = None) -> CostModel:
        """Build a model from measured ``(strategy, batch_size, seconds)`` rounds (repeats are reduced to medians)."""
        if not measurements:
            raise ValueError("CostModel.fit needs at least one measurement")
        samples: dict[Strategy, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for strategy, batch_size, seconds in measurements:
            if batch_size < 1 or not 0 < seconds < math.inf:
                raise ValueError(
                    f"measurement ({strategy}, {batch_size}, {seconds}): batch_size must be >= 1 and seconds a "
                    "finite number > 0"
                )
            samples[strategy][batch_size].append(seconds)
        tables = {
            strategy: [(bs, statistics.median(times)) for bs, times in by_bs.items()]
            for strategy, by_bs in samples.items()
        }
        return cls(params=fallback, tables=tables)

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
        """True when `round_time` can answer for `strategy` (measured, or a parametric fallback exists)."""
        return strategy.is_disabled or strategy in self._tables or self.params is not None

    @property
    def measured_strategies(self) -> list[Strategy]:
        """Strategies with measured timings."""
        return sorted(self._tables)

    def measurements(self) -> list[tuple[Strategy, int, float]]:
        """The measured table as ``(strategy, batch_size, seconds)`` points (``fit`` rebuilds the same model)."""
        tables = sorted(self._tables.items())
        return [(s, b, t) for s, (sizes, times) in tables for b, t in zip(sizes, times, strict=True)]

    def round_time(self, strategy: Strategy, batch_size: int) -> float:
        """Wall time (seconds) of one round of ``strategy`` over ``batch_size`` requests."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if strategy in self._tables:
            return _interpolate(*self._tables[strategy], batch_size)
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
