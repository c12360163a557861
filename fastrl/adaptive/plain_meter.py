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

from fastrl.adaptive.cost_model import CostModel
from fastrl.adaptive.round_times import RoundTimes
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import Strategy


class PlainTimeMeter:
    """A ``PlainTimeEstimator`` beside a selector: learns every round's time, estimates plain decoding's."""

    def __init__(self, calibration: CostModel) -> None:
        self.times = RoundTimes(calibration)

    def observe(self, stats: RoundStats) -> None:
        """Learn the round's time (the engine calls this after its selector's ``observe``)."""
        self.times.observe_round(stats)

    def plain_time_estimate(self, strategy: Strategy, batch_size: int, emitted: list[int], wall_time_s: float) -> float:
        """Seconds plain decoding would have taken for the round's tokens (see ``RoundTimes.plain_estimate``)."""
        return self.times.plain_estimate(strategy, batch_size, emitted, wall_time_s)
