"""The `stats_output` JSON and `plot_output` PNG of a generation run.

The JSON carries the run's rounds themselves (``round_log``), so a resumed run merges the rounds an earlier,
interrupted run wrote with its own (``read_round_log``) and its stats cover the whole run.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.buckets import DEFAULT_BS_THRESHOLDS, BatchBuckets
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.selector import StrategySelector
from fastrl.strategy.strategy import Strategy
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
        # the rest of the file covers the whole run's rounds (an interrupted run's and its resumption's)
        out["bandit_covers"] = "the rounds of this process, and what a bandit_state it started from had learned"
    out["round_log"] = [asdict(s) | {"strategy": str(s.strategy)} for s in stats]
    return out


READ_ERRORS = (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError)
"""What reading a file that is not a stats JSON of `run_stats` raises."""


@dataclass(frozen=True)
class RecordedRun:
    """What a stats JSON records of its run: its rounds, the buckets they are reported in, its selector's name."""

    rounds: list[RoundStats]
    thresholds: list[int]
    selector_name: str


def _read(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _rounds(data: dict[str, Any]) -> list[RoundStats]:
    return [RoundStats(**(r | {"strategy": Strategy.parse(r["strategy"])})) for r in data["round_log"]]


def read_recorded_run(path: str | Path) -> RecordedRun:
    """The run a stats JSON written by `run_stats` records; one of ``READ_ERRORS`` for a file that is not one."""
    data = _read(path)
    thresholds = [int(t) for t in data["bucket_thresholds"]]
    BatchBuckets(tuple(thresholds))  # thresholds it could not report in are not a run's
    return RecordedRun(_rounds(data), thresholds, str(data["strategy_selector"]))


def read_round_log(path: str | Path, key: str = "stats_output") -> list[RoundStats]:
    """The rounds a stats JSON written by `run_stats` holds; ValueError naming ``key`` when it holds none."""
    try:
        return _rounds(_read(path))
    except READ_ERRORS as err:
        raise ValueError(
            f"{key}={path}: not the stats of an earlier fastrl generate run ({type(err).__name__}: {err}), so the "
            "resumed run cannot merge them; delete it or choose another stats_output"
        ) from None


def write_run_stats(
    path: str | Path,
    stats: list[RoundStats],
    selector_name: str,
    selector: StrategySelector,
    results: list[int] | None = None,
) -> None:
    """Write `run_stats` as JSON; ``results``: the indices of the outputs whose rounds these are (``generate``'s, so
    that a resumed run merges only the stats of the results it keeps)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = run_stats(stats, selector_name, selector) | ({} if results is None else {"results": sorted(results)})
    path.write_text(json.dumps(out, indent=2) + "\n")


def stats_results(path: str | Path) -> set[int] | None:
    """The output indices a stats JSON says its rounds made (None: it does not say, as files written before it did
    not); one of ``READ_ERRORS`` for a file that is not one."""
    results = _read(path).get("results")
    return None if results is None else {int(i) for i in results}


def write_run_plot(path: str | Path, stats: list[RoundStats], selector_name: str, selector: StrategySelector) -> Path:
    """PNG of chosen strategies, accept lengths, goodput, batch size and per-bucket pulls."""
    return plot_run(path, stats, selector_name, selector_thresholds(selector))


def plot_run(path: str | Path, stats: list[RoundStats], selector_name: str, thresholds: list[int]) -> Path:
    """`write_run_plot` with the batch-size buckets given (a recorded run's, ``RecordedRun``)."""
    labels = BatchBuckets(tuple(thresholds)).labels()
    return plot_rounds(
        stats, bucket_indices(stats, thresholds), labels, path, title=f"strategy selector: {selector_name}"
    )
