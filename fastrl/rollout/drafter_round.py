"""The end of a rollout's co-training, for any set of workers: finish the updates due, merge, push, measure."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from fastrl.cotrain.cotrainer import SliceMetrics, TrainedDrafter, average_drafters
from fastrl.rollout.cotrain_stats import combine_rounds, heldout_mean
from fastrl.rollout.types import DrafterTrainingStats
from fastrl.rollout.worker_cotrain import RoundReport


def close_drafter_round(
    call_all: Callable[[str], list],
    version: int,
    push: Callable[[int, dict[str, Tensor]], None],
    slices: list[tuple[str, SliceMetrics]],
) -> DrafterTrainingStats:
    """Every worker finishes the rollout's updates (``steps`` schedule) and reports them (``call_all(method)``
    calls a worker method on every live worker and returns the answers in slot order); the copies trained on top
    of drafter ``version`` are averaged (weighted by steps, in slot order) into ``version + 1`` and ``push``ed;
    the held-out top-1 is measured before and after the push."""
    reports: list[RoundReport] = call_all("finish_drafter_round")
    stats = combine_rounds(reports, slices)
    trained: list[TrainedDrafter] = [t for t in call_all("trained_drafter") if t is not None]
    items = [(t.state, float(t.steps)) for t in trained if t.base_version == version]
    if not items:
        return stats
    try:
        merged = average_drafters(items)
    except ValueError as err:
        stats.failures.append(f"merge: {err}")
        return stats
    push(version + 1, merged)
    if stats.heldout_tokens:
        stats.heldout_top1 = heldout_mean(call_all("heldout_top1"))
    return stats
