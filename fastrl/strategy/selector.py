"""The interface between the engine and whatever decides each round's speculation strategy."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import Strategy


@runtime_checkable
class StrategySelector(Protocol):
    """Chooses a strategy before every decode round and learns from the round's statistics after it.

    The engine calls ``choose(batch_size)`` before a round, runs the round with the returned strategy (which is
    always one of ``strategies``), then calls ``observe(stats)`` with that round's ``RoundStats``. It pre-builds
    runtime state (buffers, CUDA graphs) for every member of ``strategies`` once, so switching is a swap.
    ``state_dict``/``load_state_dict`` hold plain Python data (JSON-serialisable) so that a resumed run makes the
    same choices as an uninterrupted one.
    """

    @property
    def strategies(self) -> list[Strategy]:
        """The strategy space: every strategy ``choose`` may return."""
        ...

    def choose(self, batch_size: int) -> Strategy:
        """The strategy for the next round over ``batch_size`` running requests."""
        ...

    def observe(self, stats: RoundStats) -> None:
        """Learn from the round just run."""
        ...

    def state_dict(self) -> dict:
        """Everything needed to resume the policy exactly."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""
        ...


@runtime_checkable
class PlainTimeEstimator(Protocol):
    """A selector that also knows what plain decoding costs (the bandit's cost model): it estimates, for every round,
    the seconds plain decoding would have needed for the tokens the round emitted."""

    def plain_time_estimate(self, stats: RoundStats) -> float:
        """Estimated plain-decoding seconds for the tokens of the round ``stats`` (its ``plain_time_estimate_s`` not
        read; 0.0 when unknown)."""
        ...


def plain_time_estimate(estimator: StrategySelector | PlainTimeEstimator, stats: RoundStats) -> float:
    """What plain decoding would have taken for a round's tokens: the estimate of a selector (or meter) that makes
    one; else a plain round's own time (``RoundStats.own_time_s``), and 0.0 (no estimate) for a speculative round."""
    estimate = getattr(estimator, "plain_time_estimate", None)  # a protocol isinstance costs ~12 us a round
    if estimate is not None:
        return estimate(stats)
    return stats.own_time_s if stats.strategy.is_disabled else 0.0
