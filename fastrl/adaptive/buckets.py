"""Batch-size buckets: thresholds ``[1, 2, 5, 21]`` mean buckets ``[1], [2-4], [5-20], [21+]``."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

DEFAULT_BS_THRESHOLDS: tuple[int, ...] = (1, 2, 5, 21)


@dataclass(frozen=True)
class BatchBuckets:
    """Maps a batch size to the bucket whose lower threshold is the largest one not above it."""

    thresholds: tuple[int, ...]

    def __post_init__(self) -> None:
        values = list(self.thresholds)
        if not values:
            raise ValueError("bs_thresholds must be non-empty")
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise ValueError(f"bs_thresholds must be positive ints, got {values}")
        if values[0] != 1:
            raise ValueError(f"bs_thresholds must start at 1 (every batch size needs a bucket), got {values}")
        if any(b <= a for a, b in zip(values, values[1:], strict=False)):
            raise ValueError(f"bs_thresholds must be strictly increasing, got {values}")

    def __len__(self) -> int:
        return len(self.thresholds)

    def index(self, batch_size: int) -> int:
        """Bucket index of ``batch_size`` (>= 1)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return bisect.bisect_right(self.thresholds, batch_size) - 1

    def label(self, index: int) -> str:
        """Human-readable range of bucket ``index``: ``"1"``, ``"2-4"``, ``"21+"``."""
        low = self.thresholds[index]
        if index == len(self.thresholds) - 1:
            return f"{low}+"
        high = self.thresholds[index + 1] - 1
        return str(low) if high == low else f"{low}-{high}"

    def labels(self) -> list[str]:
        """Labels of all buckets, in order."""
        return [self.label(i) for i in range(len(self.thresholds))]
