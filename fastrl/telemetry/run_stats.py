"""The `stats_output` JSON and `plot_output` PNG of a generation run."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.buckets import DEFAULT_BS_THRESHOLDS, BatchBuckets
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.selector import StrategySelector
from fastrl.telemetry.arm_plots import plot_rounds
from fastrl.telemetry.arm_table import arm_table, arm_table_json, bucket_indices
from fastrl.telemetry.round_summary import summarize_rounds

DEFAULT_THRESHOLDS = list(DEFAULT_BS_THRESHOLDS)


def selector_thresholds(selector: StrategySelector) -> list[int]:
    """The batch-size buckets a run's rounds are reported in: the bandit's own, else the default ones."""
    return list(selector.config.bs_thresholds) if isinstance(selector, BanditSelector) else DEFAULT_THRESHOLDS


def run_stats(stats: list[RoundStats], selector_name: str, selector: StrategySelector) -> dict[str, Any]:
    """Summary, per-bucket arm table, timeline, and the bandit's own view (estimates) when it is one."""
    thresholds = selector_thresholds(selector)
    out = summarize_rounds(stats).to_json()
    out["strategy_selector"] = selector_name
    out["bucket_thresholds"] = list(thresholds)
    out["arms"] = arm_table_json(arm_table(stats, list(thresholds)))
    if isinstance(selector, BanditSelector):
        telemetry = selector.telemetry()
        out["bandit"] = [
            {
                "bucket": b.label,
                "rounds": b.rounds,
                "arms": [asdict(a) | {"strategy": str(a.strategy)} for a in b.arms],
            }
            for b in telemetry.buckets
        ]
    return out


def write_run_stats(path: str | Path, stats: list[RoundStats], selector_name: str, selector: StrategySelector) -> None:
    """Write `run_stats` as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run_stats(stats, selector_name, selector), indent=2) + "\n")


def write_run_plot(path: str | Path, stats: list[RoundStats], selector_name: str, selector: StrategySelector) -> Path:
    """PNG of chosen strategies, accept lengths, goodput, batch size and per-bucket pulls."""
    thresholds = selector_thresholds(selector)
    labels = BatchBuckets(tuple(thresholds)).labels()
    return plot_rounds(
        stats, bucket_indices(stats, thresholds), labels, path, title=f"strategy selector: {selector_name}"
    )
