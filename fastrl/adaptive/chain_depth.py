"""The depth a stopping chain (``S_1_N@P``) reaches, and what a round of it costs at that depth.

A stopping chain drafts only while the drafter is sure, so its round costs what the fixed chain of the depth it
reached costs (``Strategy.truncated``: that many drafter steps, a verify of one more token), and that depth is not a
constant of the arm: it follows the text (a calibration's random patterns, said twice, let the drafter run deep) and
the batch size (the stop takes the mean over the rows, so a larger batch rarely stops early: on this CPU's long-tail
batch, 3.8 levels a round at batch 1, 5.3 at 2-4, up to 6 above). One calibrated time per batch size then misleads
twice: the calibration's depth is not the rollout's, and a time learned at one batch size carries another size's
depth. So a stopping chain's round time is modelled as ``a(b) + s(b) x depth``, the line through the calibrated
fixed chains of the same drafter at batch size ``b`` (the cost of one level and of the rest of a round), and the
depth it will reach at ``b`` as the mean depth its rounds reached at batch sizes of the same power of two
(``ChainRounds``); before any round, the depth that puts the line at the arm's own calibrated time. Its tokens per
row follow the batch size for the same reason (a shallow stop at a large batch emits less), so the bandit scales the
per-depth acceptance's prediction (which pools every batch size) by the ratio of what its rounds emitted at that
power of two to what they emitted at all sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastrl.strategy.strategy import Strategy

DEPTH_MEMORY = 128
"""Rounds the mean depth at one batch-size bin averages over (older rounds weigh less once it has that many)."""


@dataclass(frozen=True)
class ChainLine:
    """Seconds of a chain round at batch size ``b`` as ``base + per_level x depth`` (one batch size's fit)."""

    base: float
    per_level: float

    def seconds(self, depth: float) -> float:
        """Round time at ``depth`` drafted tokens."""
        return self.base + self.per_level * depth

    def depth_at(self, seconds: float, most: int) -> float:
        """The depth whose round takes ``seconds``, within [1, ``most``]."""
        return min(float(most), max(1.0, (seconds - self.base) / self.per_level))

    @classmethod
    def fit(cls, points: list[tuple[int, float]]) -> ChainLine | None:
        """Least squares through ``(depth, seconds)`` points; None without two depths, or where a level or the rest
        of a round would cost nothing or less (noise: such a line says nothing about depth, and could predict a round
        of no time)."""
        depths = {d for d, _ in points}
        if len(depths) < 2:
            return None
        n = len(points)
        mean_d = sum(d for d, _ in points) / n
        mean_t = sum(t for _, t in points) / n
        spread = sum((d - mean_d) ** 2 for d, _ in points)
        slope = sum((d - mean_d) * (t - mean_t) for d, t in points) / spread
        base = mean_t - slope * mean_d
        if not (slope > 0 and base > 0):
            return None
        return cls(base, slope)


def fixed_chains(arm: Strategy, calibrated: list[Strategy]) -> list[Strategy]:
    """The calibrated fixed chains that time a round of stopping chain ``arm`` (at their depth, ``arm.truncated``
    is one of them; deeper or shallower ones measure the cost of a level): the same history part, no stop."""
    return [
        c
        for c in calibrated
        if c.uses_drafter and c.topk == 1 and not c.stops_early and c.history_nodes == arm.history_nodes
    ]


def counted(rounds: float) -> float:
    """The rounds a bin's means stand for: all of them up to ``DEPTH_MEMORY``, which the means forget beyond."""
    return min(rounds, DEPTH_MEMORY)


def size_bin(batch_size: int) -> int:
    """Batch sizes of one power of two share a bin: 1, 2-3, 4-7, 8-15, ..."""
    return batch_size.bit_length() - 1


class ChainRounds:
    """What a stopping chain's rounds reached per batch-size bin: mean drafted depth and mean tokens a row emitted
    (see the module docstring). Both depend on the batch size through the stop, which takes the mean over the rows:
    at batch 64 on this CPU's long-tail batch a stopping chain's rounds drafted 2-6 levels and emitted 1.6-5.6
    tokens a row, at batch 1 about 4 a row at depth 3.8."""

    def __init__(self) -> None:
        self._means: dict[Strategy, dict[int, list[float]]] = {}  # arm -> bin -> [depth, tokens per row, rounds]

    def observe(self, arm: Strategy, batch_size: int, depth: int, tokens_per_row: float) -> None:
        """One round of ``arm`` over ``batch_size`` rows that drafted ``depth`` levels and emitted
        ``tokens_per_row`` tokens a row."""
        cell = self._means.setdefault(arm, {}).setdefault(size_bin(batch_size), [0.0, 0.0, 0.0])
        cell[2] += 1.0
        weight = 1.0 / counted(cell[2])
        cell[0] += (depth - cell[0]) * weight
        cell[1] += (tokens_per_row - cell[1]) * weight

    def depth(self, arm: Strategy, batch_size: int) -> float | None:
        """Expected depth at ``batch_size``: its bin's mean, else the nearest bin's that has rounds (the smaller on a
        tie); None before any round of ``arm``."""
        bins = self._means.get(arm)
        if not bins:
            return None
        target = size_bin(batch_size)
        nearest = min(bins, key=lambda k: (abs(k - target), k))
        return bins[nearest][0]

    def tokens_ratio(self, arm: Strategy, batch_size: int) -> tuple[float, float]:
        """Mean tokens a row emitted at ``batch_size``'s bin over the arm's mean at every bin (its rounds weighed
        alike), and the rounds behind the bin's mean ((1, 0) without any)."""
        bins = self._means.get(arm, {})
        cell = bins.get(size_bin(batch_size))
        if cell is None:
            return 1.0, 0.0
        weights = {k: counted(v[2]) for k, v in bins.items()}
        overall = sum(v[1] * weights[k] for k, v in bins.items()) / sum(weights.values())
        return (cell[1] / overall if overall > 0 else 1.0), weights[size_bin(batch_size)]

    def state(self) -> dict:
        """Plain data: {arm: {bin: [depth, tokens per row, rounds]}}."""
        return {str(arm): {str(k): list(v) for k, v in bins.items()} for arm, bins in self._means.items()}

    def load(self, state: dict) -> None:
        """Take the means of ``state`` (``state()``'s form), replacing any held."""
        self._means = {
            Strategy.parse(arm): {int(k): [float(x) for x in v] for k, v in bins.items()} for arm, bins in state.items()
        }

    @staticmethod
    def merge_states(states: list[dict]) -> dict:
        """Several workers' ``state()``s as one: per arm and bin, the means weighted by the rounds behind each
        (at most ``DEPTH_MEMORY``) and the rounds summed."""
        sums: dict[str, dict[str, list[float]]] = {}
        for state in states:
            for arm, bins in state.items():
                for k, (depth, tokens, rounds) in bins.items():
                    weight = counted(float(rounds))
                    cell = sums.setdefault(arm, {}).setdefault(k, [0.0, 0.0, 0.0, 0.0])
                    cell[0] += weight * float(depth)
                    cell[1] += weight * float(tokens)
                    cell[2] += float(rounds)
                    cell[3] += weight
        return {arm: {k: [d / w, t / w, n] for k, (d, t, n, w) in bins.items() if w > 0} for arm, bins in sums.items()}
