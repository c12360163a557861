"""Summaries of an engine's RoundStats: per strategy and overall, plus the timeline of chosen strategies."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastrl.strategy.round_stats import RoundStats


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
    """Aggregate a list of RoundStats (accept lengths are row-weighted means of accepted + 1)."""
    by: dict[str, list[RoundStats]] = {}
    for s in stats:
        by.setdefault(str(s.strategy), []).append(s)
    parts = []
    for name, group in by.items():
        rows = sum(s.batch_size for s in group)
        parts.append(
            StrategySummary(
                strategy=name,
                rounds=len(group),
                rows=rows,
                emitted_tokens=sum(s.total_emitted for s in group),
                mean_accept_length=sum(sum(s.accepted_tokens) for s in group) / rows + 1.0,
                wall_time_s=sum(s.wall_time_s for s in group),
                draft_time_s=sum(s.draft_time_s for s in group),
                verify_time_s=sum(s.verify_time_s for s in group),
            )
        )
    rows = sum(s.batch_size for s in stats)
    return RoundSummary(
        rounds=len(stats),
        emitted_tokens=sum(s.total_emitted for s in stats),
        wall_time_s=sum(s.wall_time_s for s in stats),
        mean_accept_length=(sum(sum(s.accepted_tokens) for s in stats) / rows + 1.0) if rows else 0.0,
        strategies=parts,
        timeline=[(str(s.strategy), s.batch_size, s.mean_accept_length) for s in stats],
    )
