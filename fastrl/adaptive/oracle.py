"""The per-bucket oracle: the best fixed strategy for each (phase, batch-size bucket) of a run.

The analytic estimate (``oracle_table``): were the tokens emitted at batch size ``b`` fixed by the response lengths
(with lengths sorted ascending, ``b * (L[n-b] - L[n-b-1])`` tokens) and a round's accepted tokens ``E[accepted]``
for every request, a strategy would spend ``n * round_time(b) / (b * (E[accepted] + 1))`` seconds on ``n`` tokens at
batch size ``b``. Neither holds under speculation: a round emits several tokens per request, so requests finish at
other batch sizes than plain decoding's (the tail runs alone for more or fewer tokens), and averaging acceptance over
the requests' jitter before inverting it is optimistic where one request runs alone (``1 / E[a + 1] <= E[1 / (a +
1)]``). The analytic pick is therefore only a start: ``search_table`` simulates fixed per-bucket tables under the
run's common random numbers (a coordinate search: one cell changed at a time, among the strategies whose analytic
time is within a margin of the cell's best), so the oracle the simulator reports is at least as good as every fixed
per-bucket choice it tried. It knows the phase, the acceptance model and the cost model exactly.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

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


Table = dict[tuple[int, int], Strategy]
"""(phase index, bucket index) -> strategy."""


def expected_times(
    workload: Workload,
    strategies: list[Strategy],
    buckets: BatchBuckets,
    cost: CostModel,
    lengths_per_rollout: list[np.ndarray],
) -> dict[tuple[int, int], dict[Strategy, float]]:
    """(phase index, bucket index) -> each strategy's analytic expected seconds there (see the module docstring;
    a cell the lengths never visit is weighed as one token at batch size 1)."""
    weights: dict[tuple[int, int], dict[int, int]] = defaultdict(dict)
    for rollout, lengths in enumerate(lengths_per_rollout):
        phase = workload.phase_index(rollout)
        for b, n in tokens_by_batch_size(lengths).items():
            cell = weights[(phase, buckets.index(b))]
            cell[b] = cell.get(b, 0) + n
    return {
        (phase, bucket): {
            s: expected_bucket_time(s, weights.get((phase, bucket), {1: 1}), workload, phase, cost) for s in strategies
        }
        for phase in range(len(workload.phases))
        for bucket in range(len(buckets))
    }


def oracle_table(
    workload: Workload,
    strategies: list[Strategy],
    buckets: BatchBuckets,
    cost: CostModel,
    lengths_per_rollout: list[np.ndarray],
) -> Table:
    """(phase index, bucket index) -> the strategy with the least analytic expected time there (an estimate, not a
    bound: see the module docstring and ``search_table``)."""
    times = expected_times(workload, strategies, buckets, cost, lengths_per_rollout)
    return {cell: min(strategies, key=by_arm.__getitem__) for cell, by_arm in times.items()}


def search_table(
    starts: list[Table],
    candidates: dict[tuple[int, int], list[Strategy]],
    run_time: Callable[[Table], float],
    max_passes: int = 2,
) -> tuple[Table, float]:
    """The fixed per-bucket table with the least ``run_time`` (simulated seconds of the whole run) found by a
    coordinate search: from the best of ``starts``, each cell in turn tries its ``candidates``, keeping a change
    that shortens the run, for at most ``max_passes`` passes over the cells (fewer when a pass changes nothing).
    Returns the table and its time, which is at most the time of every table it tried."""
    if not starts:
        raise ValueError("search_table needs at least one start table")
    timed = [(run_time(table), i, table) for i, table in enumerate(starts)]
    best_time, _, best = min(timed, key=lambda t: (t[0], t[1]))
    best = dict(best)
    for _ in range(max_passes):
        changed = False
        for cell, arms in candidates.items():
            for arm in arms:
                if arm == best.get(cell):
                    continue
                trial = {**best, cell: arm}
                trial_time = run_time(trial)
                if trial_time < best_time:
                    best, best_time, changed = trial, trial_time, True
        if not changed:
            break
    return best, best_time


def candidate_arms(
    times: dict[tuple[int, int], dict[Strategy, float]], margin: float
) -> dict[tuple[int, int], list[Strategy]]:
    """Per cell, the strategies whose analytic time is within ``margin`` (relative) of the cell's best, best first;
    the cells with the most analytic time first."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    chosen: dict[tuple[int, int], list[Strategy]] = {}
    for cell, by_arm in sorted(times.items(), key=lambda item: -min(item[1].values())):
        least = min(by_arm.values())
        chosen[cell] = sorted((s for s, t in by_arm.items() if t <= least * (1.0 + margin)), key=by_arm.__getitem__)
    return chosen


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
