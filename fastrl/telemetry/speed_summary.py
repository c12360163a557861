"""The closing speed summary of a run: `fastrl generate` (from the engine's decode rounds) and `fastrl train` (from
its steps' metrics), printed as the lines a newcomer reads at the end."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TextIO

from fastrl.rl.metrics import StepMetrics
from fastrl.rl.rollout_speed import SpeedStory, count_arm_rounds, estimated_plain_time, merge_arm_rounds
from fastrl.strategy.round_stats import RoundStats, RoundTotals, pooled_accept_length
from fastrl.strategy.selector import StrategySelector
from fastrl.telemetry.run_stats import selector_thresholds


def rounds_speed(stats: list[RoundStats], thresholds: Iterable[int]) -> SpeedStory:
    """The speed story of an engine's decode rounds (time = the rounds' summed wall time)."""
    totals = RoundTotals.of(stats)
    return SpeedStory(
        tokens=totals.emitted,
        wall_time_s=totals.wall_time_s,
        accept_length=totals.mean_accept_length,
        plain_time_estimate_s=estimated_plain_time(
            totals.wall_time_s, [(s.wall_time_s, s.plain_time_estimate_s) for s in stats]
        ),
        arm_rounds=count_arm_rounds([(s.batch_size, str(s.strategy)) for s in stats], thresholds),
    )


def steps_speed(history: list[StepMetrics], thresholds: Iterable[int]) -> SpeedStory:
    """The speed story of a training run's rollouts: tokens and rollout time summed over steps; the accept length
    of all their decode rounds (tokens over request-rounds: each step's `decode_rows`, estimated as tokens / accept
    length for a step logged without it); the plain-decoding estimate by `estimated_plain_time` over the steps (a
    step without one scaled like those that carry one), None when no step carries one."""
    rows = [m.decode_rows if m.decode_rows is not None else _rows_of(m) for m in history]
    wall_time_s = sum(m.rollout_time_s for m in history)
    return SpeedStory(
        tokens=sum(m.response_tokens for m in history),
        wall_time_s=wall_time_s,
        accept_length=pooled_accept_length([(m.mean_accept_length, n) for m, n in zip(history, rows, strict=True)]),
        plain_time_estimate_s=estimated_plain_time(
            wall_time_s, [(m.rollout_time_s, m.plain_time_estimate_s or 0.0) for m in history]
        ),
        arm_rounds=merge_arm_rounds((m.arm_rounds for m in history), thresholds),
    )


def _rows_of(m: StepMetrics) -> float:
    """A step's request-rounds from its tokens and accept length (metrics logged before `decode_rows`)."""
    return m.response_tokens / m.mean_accept_length if m.mean_accept_length > 0 else 0.0


def print_speed_summary(title: str, story: SpeedStory, file: TextIO | None = None, tokens: str = "tokens") -> None:
    """``title``, then tokens/s and accept length, time against plain decoding, and the choices per bucket.
    ``tokens`` names what was counted (generate counts its decode rounds' tokens, not the first one of a request)."""
    out = file if file is not None else sys.stdout
    print(f"{title}: {story.tokens} {tokens} in {story.wall_time_s:.1f} s, {story.tokens_per_s:.0f} tok/s", file=out)
    print(
        f"  accept length {story.accept_length:.2f} (tokens per request per decode round, accepted drafts + 1; "
        "1.00 = plain)",
        file=out,
    )
    print(f"  against plain decoding: {story.plain_words()}", file=out)
    print(f"  strategy chosen per batch-size bucket: {story.choice_words()}", file=out)


def print_generate_summary(stats: list[RoundStats], selector: StrategySelector, file: TextIO | None = None) -> None:
    """The end of `fastrl generate`: the speed story of the decode rounds this run made (the first token of each
    request is sampled by its prefill, outside them); one line saying so when it made none."""
    if not stats:
        print(
            "fastrl generate: no decode round ran (every request ended at its first token, sampled at prefill, or "
            "was refused): no speed to report",
            file=file if file is not None else sys.stdout,
        )
        return
    story = rounds_speed(stats, selector_thresholds(selector))
    print_speed_summary("fastrl generate", story, file, tokens="tokens from decode rounds")
