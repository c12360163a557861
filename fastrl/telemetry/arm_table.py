"""Per batch-size bucket and strategy: pulls, mean reward (goodput) and accept length of the rounds run."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from fastrl.adaptive.buckets import BatchBuckets
from fastrl.strategy.round_stats import RoundStats, RoundTotals


@dataclass
class ArmRow:
    """One (bucket, strategy) cell over a run."""

    bucket: str
    strategy: str
    pulls: int
    mean_goodput: float
    mean_accept_length: float
    rows: int


def arm_table(stats: list[RoundStats], thresholds: list[int]) -> list[ArmRow]:
    """Aggregate rounds by bucket and strategy (buckets in order, strategies by pulls)."""
    buckets = BatchBuckets(tuple(thresholds))
    cells: dict[tuple[int, str], list[RoundStats]] = {}
    for s in stats:
        cells.setdefault((buckets.index(s.batch_size), str(s.strategy)), []).append(s)
    rows = []
    for (index, name), group in sorted(cells.items(), key=lambda kv: (kv[0][0], -len(kv[1]))):
        totals = RoundTotals.of(group)
        rows.append(
            ArmRow(
                bucket=buckets.label(index),
                strategy=name,
                pulls=len(group),
                mean_goodput=sum(s.goodput for s in group) / len(group),
                mean_accept_length=totals.mean_accept_length,
                rows=totals.rows,
            )
        )
    return rows


def bucket_indices(stats: list[RoundStats], thresholds: list[int]) -> list[int]:
    """The bucket index of every round (for plots)."""
    buckets = BatchBuckets(tuple(thresholds))
    return [buckets.index(s.batch_size) for s in stats]


def arm_table_json(rows: list[ArmRow]) -> list[dict]:
    """JSON-ready rows."""
    return [asdict(r) for r in rows]
