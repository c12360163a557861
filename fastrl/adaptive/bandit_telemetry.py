"""Typed telemetry of the bandit: per (bucket, arm) statistics and the timeline of choices."""

from __future__ import annotations

from dataclasses import dataclass

from fastrl.strategy.strategy import Strategy

CHOICE_REASONS = ("untried", "explore", "exploit", "bs_threshold")


@dataclass(frozen=True)
class ArmTelemetry:
    """One arm in one bucket: pulls, window and all-time mean reward, and the estimate the bandit acts on."""

    strategy: Strategy
    pulls: int
    window_mean: float | None
    all_time_mean: float | None
    estimate: float | None
    borrowed_from: int | None
    """Index of the neighbouring bucket the estimate leans on: borrowed outright when the arm has no rounds in
    this bucket, else the prior its accept length is shrunk toward (None when there is none)."""


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
