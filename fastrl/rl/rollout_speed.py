"""The speed story of a rollout: tokens/s, accept length, time against the estimated plain-decoding time, and the
strategy the selector chose per batch-size bucket. One `SpeedStory` serves a train step, a whole run and a
`fastrl generate` run; its `line()` and `postfix()` are what the terminal shows."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fastrl.adaptive.buckets import BatchBuckets
from fastrl.rollout.types import RolloutBatch, RoundRecord
from fastrl.strategy.round_stats import pooled_accept_length
from fastrl.strategy.strategy import DISABLE_NAME


@dataclass
class SpeedStory:
    """How fast decoding went.

    tokens: tokens generated; wall_time_s: the wall time they took; accept_length: tokens per request per decode
    round (1.0 = plain decoding); plain_time_estimate_s: the estimated wall time plain decoding would have taken
    for the same tokens (None: the selector made no estimate); arm_rounds: decode rounds per batch-size bucket and
    strategy (bucket label -> strategy -> rounds).
    """

    tokens: int
    wall_time_s: float
    accept_length: float
    plain_time_estimate_s: float | None = None
    arm_rounds: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def speedup(self) -> float | None:
        """Estimated plain time / actual time (None without an estimate)."""
        if self.plain_time_estimate_s is None or self.wall_time_s <= 0:
            return None
        return self.plain_time_estimate_s / self.wall_time_s

    @property
    def choices(self) -> dict[str, str]:
        """The strategy chosen most often in each bucket (bucket label -> strategy), buckets in order."""
        return {b: max(arms, key=lambda s: (arms[s], s)) for b, arms in self.arm_rounds.items() if arms}

    def plain_words(self) -> str:
        """``"plain decoding est. 31.0 s: 1.80x"`` or ``"no plain-decoding estimate"``."""
        if self.speedup is None:
            return "no plain-decoding estimate"
        return f"plain decoding est. {self.plain_time_estimate_s:.1f} s: {self.speedup:.2f}x"

    def choice_words(self) -> str:
        """``"1: 5_1_6, 2-4: 3_1_4"`` (bucket: chosen strategy), or ``"none"`` without rounds."""
        return ", ".join(f"{b}: {s}" for b, s in self.choices.items()) or "none"

    def line(self) -> str:
        """One line: tokens/s, accept length, time against plain decoding, choices per batch-size bucket."""
        return (
            f"{self.tokens} tokens in {self.wall_time_s:.1f} s ({self.tokens_per_s:.0f} tok/s), "
            f"accept length {self.accept_length:.2f}, {self.plain_words()}; "
            f"strategy by batch size: {self.choice_words()}"
        )

    def postfix(self) -> dict[str, str]:
        """Progress-bar fields: tok/s, accept length, speedup (or "no estimate"), choices per bucket."""
        speedup = f"{self.speedup:.2f}x" if self.speedup is not None else "no estimate"
        choices = " ".join(f"{b}:{s}" for b, s in self.choices.items())
        return {"tok/s": f"{self.tokens_per_s:.0f}", "accept": f"{self.accept_length:.2f}", "vs_plain": speedup} | (
            {"bs:strategy": choices} if choices else {}
        )


def count_arm_rounds(rounds: Iterable[tuple[int, str]], thresholds: Iterable[int]) -> dict[str, dict[str, int]]:
    """Decode rounds per bucket and strategy from (batch size, strategy) pairs; buckets in threshold order."""
    buckets = BatchBuckets(tuple(thresholds))
    counts: dict[int, dict[str, int]] = {}
    for batch_size, strategy in rounds:
        cell = counts.setdefault(buckets.index(batch_size), {})
        cell[strategy] = cell.get(strategy, 0) + 1
    return {buckets.label(i): counts[i] for i in sorted(counts)}


def merge_arm_rounds(
    tables: Iterable[dict[str, dict[str, int]]], thresholds: Iterable[int]
) -> dict[str, dict[str, int]]:
    """Sum of several arm-round tables (steps of a run), buckets in threshold order."""
    order = BatchBuckets(tuple(thresholds)).labels()
    total: dict[str, dict[str, int]] = {}
    for table in tables:
        for bucket, arms in table.items():
            cell = total.setdefault(bucket, {})
            for strategy, n in arms.items():
                cell[strategy] = cell.get(strategy, 0) + n
    return {b: total[b] for b in sorted(total, key=lambda b: order.index(b) if b in order else len(order))}


def estimated_plain_time(wall_time_s: float, round_times: Iterable[tuple[float, float]]) -> float | None:
    """The plain-decoding estimate of a rollout of ``wall_time_s``: its wall time scaled by the ratio of estimated
    plain time to actual time over the decode rounds that carry an estimate (``(wall, estimate)`` pairs; an
    estimate of 0 is none). None when no round carries one."""
    estimated = [(wall, plain) for wall, plain in round_times if plain > 0]
    wall = sum(w for w, _ in estimated)
    if not estimated or wall <= 0:
        return None
    return wall_time_s * sum(p for _, p in estimated) / wall


def rollout_plain_time(batch: RolloutBatch) -> float | None:
    """The plain-decoding estimate of a rollout: each worker's generation time (``WorkerTiming.busy_s``) with its
    decode rounds replaced by their plain estimates (rounds without one scaled like those that carry one, see
    ``estimated_plain_time``), and the rollout's time outside its slowest worker's generation (dispatch, gathering,
    co-training after the batch: a plain run pays it too) kept as it is. Without worker timings, the whole wall
    time is scaled. None when no round carries an estimate."""
    by_worker: dict[str, list[tuple[float, float]]] = {}
    for r in batch.rounds:
        by_worker.setdefault(r.worker_id, []).append((r.wall_time_s, r.plain_time_estimate_s))
    scaled = estimated_plain_time(batch.wall_time_s, [pair for own in by_worker.values() for pair in own])
    if scaled is None or not batch.workers:
        return scaled
    busy, plain = [], []
    for timing in batch.workers:
        own = by_worker.get(timing.worker_id, [])
        decode = sum(wall for wall, _ in own)
        estimate = estimated_plain_time(decode, own)
        busy.append(timing.busy_s)
        plain.append(timing.busy_s + (estimate - decode if estimate is not None else 0.0))
    return batch.wall_time_s - max(busy) + max(plain)


def speculative_accept_length(rounds: Iterable[RoundRecord]) -> float | None:
    """Row-weighted tokens per round over the rounds that drafted (not ``disable``): the drafter's quality, apart
    from how often the selector chose plain decoding. None when no round drafted."""
    drafted = [(r.mean_accept_length, r.batch_size) for r in rounds if r.strategy != DISABLE_NAME]
    return pooled_accept_length(drafted) if drafted else None


def step_speed_fields(batch: RolloutBatch, thresholds: Iterable[int]) -> dict[str, Any]:
    """StepMetrics' speed keys of one rollout: tokens/s, the plain-decoding estimate and the speedup, decode rounds
    and the chosen strategy per batch-size bucket."""
    story = SpeedStory(
        tokens=sum(len(r.token_ids) for r in batch.results),
        wall_time_s=batch.wall_time_s,
        accept_length=0.0,  # StepMetrics.mean_accept_length holds it
        plain_time_estimate_s=rollout_plain_time(batch),
        arm_rounds=count_arm_rounds([(r.batch_size, r.strategy) for r in batch.rounds], thresholds),
    )
    return {
        "speculative_accept_length": speculative_accept_length(batch.rounds),
        "rollout_tokens_per_s": story.tokens_per_s,
        "plain_time_estimate_s": story.plain_time_estimate_s,
        "estimated_speedup": story.speedup,
        "arm_rounds": story.arm_rounds,
        "strategy_choices": story.choices,
    }
