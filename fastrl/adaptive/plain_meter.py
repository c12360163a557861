"""The plain-decoding estimate of an engine whose selector has no cost model of its own.

The bandit knows what a plain round costs at each batch size (its calibration, refined by every round), so every
round it runs carries the seconds plain decoding would have needed for the same tokens. A fixed strategy and SGLang's
EMA tiers choose without costs; this meter gives their engines the same estimate from the same model: a calibration of
plain decoding and the selector's arms (``fastrl.engine.calibration``, cached like the bandit's) and the bandit's
round-time model (``RoundTimes``), which learns the machine's load from every round. With no plain round among them,
a round's plain time is the calibrated plain time at its batch size scaled by the load its own rounds show: the
calibration's plain-to-arm ratio carries the estimate.
"""

from __future__ import annotations

import time

from fastrl.adaptive.cost_model import CostModel
from fastrl.adaptive.round_times import RoundTimes
from fastrl.strategy.round_stats import RoundStats

SHARE = 0.005
"""Most of the rounds' time the meter spends learning: learning a round costs ~50 us on this CPU (the round-time
filter's update), 1% of a bundled-model round at batch 1, so rounds that follow a learned one within 1/SHARE times
that cost share its load and are skipped (a 100 ms SmolLM2 round is learned every time)."""


class PlainTimeMeter:
    """A ``PlainTimeEstimator`` beside a selector: learns rounds' times within a share of them (``share``; None:
    every round), estimates plain decoding's."""

    def __init__(self, calibration: CostModel, share: float | None = SHARE) -> None:
        self.times = RoundTimes(calibration)
        self.share = share
        self._since = 0.0  # wall seconds of the rounds since the last one learned
        self._cost = 0.0  # seconds the last learning took
        self.learned = 0  # rounds learned

    def observe(self, stats: RoundStats) -> None:
        """Learn the round's time (the engine calls this after its selector's ``observe``), unless the rounds since
        the last learned one took less than that learning's cost over ``share``."""
        self._since += stats.wall_time_s
        if self.share is not None and self._since * self.share < self._cost:
            return
        start = time.perf_counter()
        self.times.observe_round(stats)
        self._cost, self._since = time.perf_counter() - start, 0.0
        self.learned += 1

    def plain_time_estimate(self, stats: RoundStats) -> float:
        """Seconds plain decoding would have taken for the round's tokens (see ``RoundTimes.plain_estimate``)."""
        return self.times.plain_estimate(stats)
