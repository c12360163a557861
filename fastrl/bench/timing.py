"""Timing helpers for benchmarks: medians over repeats, with device synchronisation."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastrl.models.device_sync import drain


@dataclass
class Timing:
    """Median and all repeats of one measured callable, in seconds, and what its last call returned."""

    median_s: float
    runs_s: list[float]
    result: Any = None


def time_median(fn: Callable[[], object], repeats: int, device: str = "cpu", warmup: int = 1) -> Timing:
    """Run `fn` `warmup` times untimed, then `repeats` times timed; the median wall time and the last result."""
    for _ in range(warmup):
        fn()
    runs = []
    result = None
    for _ in range(repeats):
        drain(device)
        start = time.perf_counter()
        result = fn()
        drain(device)
        runs.append(time.perf_counter() - start)
    return Timing(statistics.median(runs), runs, result)


@dataclass
class EngineRun:
    """An engine after a generate call, with its outputs (benchmarks check them against the plain run)."""

    engine: Any
    outputs: list[Any]
