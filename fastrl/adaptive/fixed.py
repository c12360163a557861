"""A selector that always returns the same strategy (``disable`` for plain decoding)."""

from __future__ import annotations

from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import Strategy


class FixedSelector:
    """Always ``strategy``; learns nothing. Accepts a ``Strategy`` or its string form."""

    def __init__(self, strategy: Strategy | str) -> None:
        self._strategy = Strategy.parse(strategy) if isinstance(strategy, str) else strategy
        if not isinstance(self._strategy, Strategy):
            raise ValueError(f"FixedSelector needs a Strategy or a strategy string, got {strategy!r}")

    @property
    def strategies(self) -> list[Strategy]:
        """The single strategy this selector uses."""
        return [self._strategy]

    def choose(self, batch_size: int) -> Strategy:
        """The fixed strategy, whatever the batch size."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return self._strategy

    def observe(self, stats: RoundStats) -> None:
        """Nothing to learn."""

    def state_dict(self) -> dict:
        """The strategy, as a string."""
        return {"strategy": str(self._strategy)}

    def load_state_dict(self, state: dict) -> None:
        """Check that the saved strategy is this policy's."""
        saved = Strategy.parse(state["strategy"])
        if saved != self._strategy:
            raise ValueError(f"state_dict is for strategy {str(saved)!r}, this selector uses {str(self._strategy)!r}")
