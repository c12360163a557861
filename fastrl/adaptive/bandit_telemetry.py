"""Typed telemetry of the bandit: per (bucket, arm) statistics and the timeline of choices."""

from __future__ import annotations

from dataclasses import dataclass

from fastrl.strategy.strategy import Strategy

CHOICE_REASONS = ("untimed", "explore", "exploit", "held", "anchor", "bs_threshold")
"""Why a round ran its strategy: an arm timed first, explored, the predicted best, the best decided earlier and held
by its stretch (nothing learned or predicted), a plain anchor, or a batch past ``bs_threshold``."""


@dataclass(frozen=True)
class ArmTelemetry:
    """One arm in one bucket: pulls, recent and all-time mean reward, and the prediction the bandit acts on at the
    bucket's last batch size (its parts: tokens per row from every arm's acceptance, round time from the
    calibration and the rounds run; None where unknown)."""

    strategy: Strategy
    pulls: int
    window_mean: float | None
    all_time_mean: float | None
    estimate: float | None
    tokens_per_row: float
    round_time_s: float | None


@dataclass(frozen=True)
class BucketTelemetry:
    """One batch-size bucket: its range, rounds and arms."""

    index: int
    label: str
    rounds: int
    arms: list[ArmTelemetry]


@dataclass(frozen=True)
class ChoiceRecord:
    """One ``choose`` call: round number, batch size, bucket, the strategy and why it was chosen."""

    round: int
    batch_size: int
    bucket: int
    strategy: Strategy
    reason: str


@dataclass(frozen=True)
class BanditTelemetry:
    """Everything the bandit can report: per-bucket arm statistics and the timeline of recent choices."""

    buckets: list[BucketTelemetry]
    timeline: list[ChoiceRecord]
