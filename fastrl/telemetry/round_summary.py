"""Summaries of an engine's RoundStats: per strategy and overall, plus the timeline of chosen strategies."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastrl.strategy.round_stats import RoundStats, RoundTotals


@dataclass
class StrategySummary:
    """Rounds run with one strategy."""

    strategy: str
    rounds: int
    rows: int
    emitted_tokens: int
    mean_accept_length: float
    wall_time_s: float
    draft_time_s: float
    verify_time_s: float

    @property
    def goodput(self) -> float:
        return self.emitted_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0


@dataclass
class RoundSummary:
    """All rounds of a run."""

    rounds: int
    emitted_tokens: int
    wall_time_s: float
    mean_accept_length: float
    strategies: list[StrategySummary]
    timeline: list[tuple[str, int, float]] = field(default_factory=list)  # (strategy, batch size, accept length)

    def to_json(self) -> dict:
        """A JSON-ready dict (goodput included)."""
        return {
            "rounds": self.rounds,
            "emitted_tokens": self.emitted_tokens,
            "wall_time_s": self.wall_time_s,
            "goodput_tok_s": self.emitted_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0,
            "mean_accept_length": self.mean_accept_length,
            "strategies": [s.__dict__ | {"goodput_tok_s": s.goodput} for s in self.strategies],
            "timeline": [{"strategy": s, "batch_size": b, "accept_length": a} for s, b, a in self.timeline],
        }


def summarize_rounds(stats: list[RoundStats]) -> RoundSummary:
    """Aggregate a list of RoundStats per strategy and overall (through RoundTotals)."""
    by: dict[str, list[RoundStats]] = {}
    for s in stats:
        by.setdefault(str(s.strategy), []).append(s)
    parts = []
    for name, group in by.items():
        t = RoundTotals.of(group)
        parts.append(
            StrategySummary(
                strategy=name,
                rounds=t.rounds,
                rows=t.rows,
                emitted_tokens=t.emitted,
                mean_accept_length=t.mean_accept_length,
                wall_time_s=t.wall_time_s,
                draft_time_s=t.draft_time_s,
                verify_time_s=t.verify_time_s,
            )
        )
    total = RoundTotals.of(stats)
    return RoundSummary(
        rounds=total.rounds,
        emitted_tokens=total.emitted,
        wall_time_s=total.wall_time_s,
        mean_accept_length=total.mean_accept_length,
        strategies=parts,
        timeline=[(str(s.strategy), s.batch_size, s.mean_accept_length) for s in stats],
    )
