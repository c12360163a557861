"""The per-bucket oracle: the best single strategy for each (phase, batch-size bucket), in expectation.

While ``b`` requests are running every one of them advances, so the tokens emitted at batch size ``b`` are fixed by
the response lengths alone: with lengths sorted ascending, ``b * (L[n-b] - L[n-b-1])`` tokens (whatever the
strategy). A strategy's expected goodput at batch size ``b`` is ``b * (E[accepted] + 1) / round_time(b)``, so the
expected time a strategy spends in a bucket is the sum over its batch sizes of tokens / goodput. The oracle picks,
per phase and bucket, the strategy with the least expected time. It knows the phase, the acceptance model and the
cost model exactly; it only lacks per-request luck.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from fastrl.adaptive.buckets import BatchBuckets
from fastrl.adaptive.cost_model import CostModel
from fastrl.adaptive.workload import Workload
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import Strategy


def tokens_by_batch_size(lengths: np.ndarray) -> dict[int, int]:
    """Tokens emitted while exactly ``b`` requests run, for one rollout of these response lengths."""
    ordered = np.sort(lengths)
    count = len(ordered)
    previous = 0
    tokens: dict[int, int] = {}
    for done, length in enumerate(ordered.tolist()):
        if length > previous:
            batch = count - done
            tokens[batch] = tokens.get(batch, 0) + batch * (length - previous)
            previous = length
    return tokens


def expected_bucket_time(
    strategy: Strategy, tokens: dict[int, int], workload: Workload, phase: int, cost: CostModel
) -> float:
    """Expected seconds ``strategy`` needs to emit ``tokens`` (batch size -> tokens) during ``phase``."""
    accept_length = workload.phases[phase].acceptance.expected_accepted(strategy) + 1.0
    return sum(n * cost.round_time(strategy, b) / (b * accept_length) for b, n in tokens.items())


def oracle_table(
    workload: Workload,
    strategies: list[Strategy],
    buckets: BatchBuckets,
    cost: CostModel,
    lengths_per_rollout: list[np.ndarray],
) -> dict[tuple[int, int], Strategy]:
    """(phase index, bucket index) -> the strategy with the least expected time there."""
    weights: dict[tuple[int, int], dict[int, int]] = defaultdict(dict)
    for rollout, lengths in enumerate(lengths_per_rollout):
        phase = workload.phase_index(rollout)
        for b, n in tokens_by_batch_size(lengths).items():
            cell = weights[(phase, buckets.index(b))]
            cell[b] = cell.get(b, 0) + n
    table: dict[tuple[int, int], Strategy] = {}
    for phase in range(len(workload.phases)):
        for bucket in range(len(buckets)):
            tokens = weights.get((phase, bucket), {1: 1})
            table[(phase, bucket)] = min(
                strategies, key=lambda s, t=tokens, p=phase: expected_bucket_time(s, t, workload, p, cost)
            )
    return table


class OracleSelector:
    """Plays the oracle table; the simulator tells it the phase (``set_phase``) at every rollout."""

    def __init__(self, table: dict[tuple[int, int], Strategy], buckets: BatchBuckets) -> None:
        self._table = table
        self._buckets = buckets
        self._phase = 0

    @property
    def strategies(self) -> list[Strategy]:
        """Every strategy the table uses."""
        return sorted(set(self._table.values()))

    def set_phase(self, phase: int) -> None:
        """Switch to the table rows of ``phase``."""
        self._phase = phase

    def choose(self, batch_size: int) -> Strategy:
        """The table's strategy for the current phase and this batch size's bucket."""
        return self._table[(self._phase, self._buckets.index(batch_size))]

    def observe(self, stats: RoundStats) -> None:
        """The oracle already knows everything."""

    def state_dict(self) -> dict:
        """The current phase (the table is rebuilt from the workload)."""
        return {"phase": self._phase}

    def load_state_dict(self, state: dict) -> None:
        """Restore the current phase."""
        self._phase = int(state["phase"])
