"""The depth a stopping chain (``S_1_N@P``) reaches, and what a round of it costs at that depth.

A stopping chain drafts only while the drafter is sure, so its round costs what the fixed chain of the depth it
reached costs (``Strategy.truncated``: that many drafter steps, a verify of one more token), and that depth is not a
constant of the arm: it follows the text (a calibration's random patterns, said twice, let the drafter run deep) and
the batch size (the stop takes the mean over the rows, so a larger batch rarely stops early: on this CPU's long-tail
batch, 3.8 levels a round at batch 1, 5.3 at 2-4, up to 6 above). One calibrated time per batch size then misleads
twice: the calibration's depth is not the rollout's, and a time learned at one batch size carries another size's
depth. So a stopping chain's round time is modelled as ``t(b, depth)``, the curve through the calibrated fixed
chains of the same drafter at batch size ``b`` (``ChainCurve``; the calibration times the chains of ``CURVE_DEPTHS``
beside the arms, ``timing_chains``), and the depth it will reach at ``b`` as the mean depth its rounds reached at
batch sizes of the same power of two (``ChainRounds``); before any round, the depth that puts the curve at the arm's
own calibrated time. (The curve is taken at the mean depth, not averaged over the depths reached: between calibrated
depths it is a line, and the arm's bias, learned round by round against the curve at each round's own depth, takes
the rest.) Its tokens per row follow the batch size for the same reason (a shallow stop at a large batch emits less),
so the bandit scales the per-depth acceptance's prediction (which pools every batch size) by the ratio of what its
rounds emitted at that power of two to what they emitted at all sizes.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from fastrl.json_values import is_real
from fastrl.strategy.strategy import Strategy

CURVE_DEPTHS = (1, 2, 3, 5, 7)
"""Depths of the fixed chains that time a stopping chain (those up to its own depth), calibrated beside the arms:
the shallow ones are where a stopping chain spends most rounds when the drafter is unsure."""
DEPTH_MEMORY = 128
"""Rounds the mean depth at one batch-size bin averages over (older rounds weigh less once it has that many)."""


@dataclass(frozen=True)
class ChainCurve:
    """Seconds of a chain round at one batch size by drafted depth: piecewise linear through the calibrated fixed
    chains' depths, made non-decreasing (a level never saves time; a calibration's noise may say it does), with the
    first and the last segment's slopes below and beyond them. A line would not do: on this CPU a SmolLM2 round
    verifying 2 or 3 tokens costs about a plain round, one verifying 4 or more about 1.5x (the LM head's small-row
    product reads its weight once up to 3 rows), so the line through depths 3, 5 and 7 put a depth-1 round at 1.34x a
    plain one, measured 1.05x."""

    depths: tuple[float, ...]
    """Calibrated depths, ascending (at least two)."""
    times: tuple[float, ...]
    """Round seconds at each depth, non-decreasing, the last above the first."""

    def seconds(self, depth: float) -> float:
        """Round time at ``depth`` drafted tokens (a mean depth may fall between levels)."""
        depths, times = self.depths, self.times
        i = min(max(bisect.bisect_right(depths, depth), 1), len(depths) - 1)  # the segment [i - 1, i] holds it
        slope = (times[i] - times[i - 1]) / (depths[i] - depths[i - 1])
        return times[i - 1] + slope * (depth - depths[i - 1])

    def depth_at(self, seconds: float, most: int) -> float:
        """The least depth within [1, ``most``] whose round takes ``seconds`` (the bounds where none does)."""
        if self.seconds(1.0) >= seconds:
            return 1.0
        knots = [1.0, *(d for d in self.depths if 1.0 < d < most), float(most)]
        for low, high in zip(knots, knots[1:], strict=False):  # the first piece that reaches it (a line on each)
            at_low, at_high = self.seconds(low), self.seconds(high)
            if at_high >= seconds:  # and at_low < seconds, so the piece rises
                return low + (seconds - at_low) / (at_high - at_low) * (high - low)
        return float(most)

    @classmethod
    def fit(cls, points: list[tuple[int, float]]) -> ChainCurve | None:
        """The curve through ``(depth, seconds)`` points (their mean at a repeated depth; adjacent falls pooled, so the
        curve never falls); None without two depths, where the deepest chain costs no more than the shallowest (noise:
        such a curve says nothing about depth) or where a one-level round would take no time or less."""
        by_depth: dict[int, list[float]] = {}
        for depth, seconds in points:
            by_depth.setdefault(depth, []).append(seconds)
        if len(by_depth) < 2:
            return None
        blocks: list[list[float]] = []  # pooled adjacent violators: [sum of times, depths pooled]
        depths = sorted(by_depth)
        for depth in depths:
            blocks.append([sum(by_depth[depth]) / len(by_depth[depth]), 1.0])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] >= blocks[-1][0] / blocks[-1][1]:
                total, count = blocks.pop()
                blocks[-1][0] += total
                blocks[-1][1] += count
        times = [block[0] / block[1] for block in blocks for _ in range(int(block[1]))]
        curve = cls(tuple(float(d) for d in depths), tuple(times))
        if not (times[-1] > times[0] and curve.seconds(1.0) > 0):
            return None
        return curve


def fixed_chains(arm: Strategy, calibrated: list[Strategy]) -> list[Strategy]:
    """The calibrated fixed chains that time a round of stopping chain ``arm`` (at their depth, ``arm.truncated``
    is one of them; deeper or shallower ones measure the cost of a level): the same history part, no stop."""
    return [
        c
        for c in calibrated
        if c.uses_drafter and c.topk == 1 and not c.stops_early and c.history_nodes == arm.history_nodes
    ]


def timing_chains(arms: list[Strategy]) -> list[Strategy]:
    """The fixed chains a calibration times beside ``arms`` (none of them already an arm) so that each stopping chain
    among them has its curve: the chains of ``CURVE_DEPTHS`` up to its depth, with its history part."""
    wanted = [
        Strategy(depth, 1, depth + 1, arm.history_nodes)
        for arm in arms
        if arm.stops_early
        for depth in CURVE_DEPTHS
        if depth <= arm.steps
    ]
    return [chain for chain in dict.fromkeys(wanted) if chain not in arms]


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
        """Take the means of ``state`` (``state()``'s form, checked by ``checked_state``), replacing any held."""
        self._means = {
            Strategy.parse(arm): {int(k): list(v) for k, v in bins.items()}
            for arm, bins in checked_state(state).items()
        }

    @staticmethod
    def merge_states(states: list[dict]) -> dict:
        """Several workers' ``state()``s as one: per arm and bin, the means weighted by the rounds behind each
        (at most ``DEPTH_MEMORY``) and the rounds summed."""
        sums: dict[str, dict[str, list[float]]] = {}
        for state in states:
            for arm, bins in checked_state(state).items():
                for k, (depth, tokens, rounds) in bins.items():
                    weight = counted(float(rounds))
                    cell = sums.setdefault(arm, {}).setdefault(k, [0.0, 0.0, 0.0, 0.0])
                    cell[0] += weight * float(depth)
                    cell[1] += weight * float(tokens)
                    cell[2] += float(rounds)
                    cell[3] += weight
        return {arm: {k: [d / w, t / w, n] for k, (d, t, n, w) in bins.items() if w > 0} for arm, bins in sums.items()}


def checked_state(state: dict) -> dict[str, dict[str, list[float]]]:
    """``ChainRounds.state()``'s form, its numbers as floats; ValueError naming the entry (``chain_rounds[arm][bin]``)
    unless every bin is a power-of-two index written in ASCII digits and holds a finite depth of at least one level
    (a chain drafts one at least: the curve through depths below it reaches no time), tokens per row and rounds,
    none negative."""
    if not isinstance(state, dict):
        raise ValueError(f"chain_rounds must be an object {{arm: {{bin: [depth, tokens, rounds]}}}}, got {state!r}")
    checked: dict[str, dict[str, list[float]]] = {}
    for arm, bins in state.items():
        if not isinstance(bins, dict):
            raise ValueError(f"chain_rounds[{arm!r}] must be an object {{bin: [depth, tokens, rounds]}}, got {bins!r}")
        checked[arm] = {}
        for k, cell in bins.items():
            where = f"chain_rounds[{arm!r}][{k!r}]"
            if not (isinstance(k, str) and k.isascii() and k.isdigit() and len(k) < 4):
                raise ValueError(f"{where}: a bin is a batch size's bit length less one, written in digits (0, 1, ...)")
            numbers = cell if isinstance(cell, list) and len(cell) == 3 else []
            if (
                not numbers
                or not all(is_real(x) and 0 <= x < math.inf for x in numbers)
                or numbers[0] < 1
                or numbers[2] <= 0
            ):  # a bin exists once a round is in it: rounds > 0 (its means are weighed by them)
                raise ValueError(
                    f"{where} must be [depth, tokens per row, rounds], finite numbers >= 0, a depth >= 1 and rounds "
                    f"> 0, got {cell!r}"
                )
            checked[arm][k] = [float(x) for x in numbers]
    return checked
