"""Truncated discrete power law: the heavy-tailed distribution of problem sizes."""

from __future__ import annotations

import bisect
import itertools
import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TruncatedPowerLaw:
    """``P(n) ∝ n^-exponent`` for integers ``n`` in ``[low, high]``; exponent 0 is uniform."""

    low: int
    high: int
    exponent: float
    _cdf: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.low < 1 or self.high < self.low:
            raise ValueError(f"TruncatedPowerLaw needs 1 <= low <= high (got low={self.low}, high={self.high})")
        weights = [n ** (-self.exponent) for n in range(self.low, self.high + 1)]
        total = sum(weights)
        object.__setattr__(self, "_cdf", tuple(c / total for c in itertools.accumulate(weights)))

    def probability(self, n: int) -> float:
        """Probability mass at `n` (0 outside the support)."""
        if not self.low <= n <= self.high:
            return 0.0
        i = n - self.low
        return self._cdf[i] - (self._cdf[i - 1] if i else 0.0)

    def sample(self, rng: random.Random) -> int:
        """One draw by inverting the CDF."""
        i = bisect.bisect_left(self._cdf, rng.random())
        return self.low + min(i, len(self._cdf) - 1)
