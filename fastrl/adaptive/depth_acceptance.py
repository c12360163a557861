"""Tokens per round of every arm, predicted from what any arm observed: per-depth acceptance shared by one source.

A request row of a speculative round accepts drafted tokens depth by depth until the first miss, so a round of a
``steps``-deep strategy that accepted ``a`` tokens is ``a`` hits at depths 1..a and, when ``a < steps``, one miss at
depth ``a + 1``. The chance of a hit at depth ``d`` given a hit at ``d - 1`` (the depth's hazard) hardly depends on
the batch size, and arms drafted by one source share it closely: every EAGLE chain ``S_1_S+1`` follows the same
greedy chain, and a larger tree only raises it. So each arm's hazard at a depth is its own hits over its own trials,
shrunk (``prior_rows`` rows of weight) toward the pooled hazard of the arms of its source whose trees contain its
own (an upper bound: ``7_1_8`` for ``3_1_4``, ``8_4_32`` for both), itself shrunk toward 1/2 with ``BASE_ROWS`` rows.
An arm never pulled is predicted from those arms' rounds, and never below an arm whose tree it contains: its
estimate lies between what the smaller trees and the larger ones of its source measured.

Every arm's counts decay by exp(-1 / ``memory_rounds``) at each round observed, so the estimate follows an
acceptance that drifts as the drafter and policy train. Expected tokens per row = 1 + sum_d prod_{j<=d} h_j; the
optimistic value raises that expectation by ``z`` of its standard errors (the exploration bound: an arm with few
rounds at the deep levels may still be much better than its mean says).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import Strategy

BASE_ROWS = 2.0
"""Weight (rows) of the uninformed hazard 1/2 that the pooled prior is shrunk toward."""


def family(strategy: Strategy) -> str:
    """The arms whose drafts come from the same source: ``eagle``, ``history`` or ``hybrid``."""
    if strategy.is_hybrid:
        return "hybrid"
    return "history" if strategy.is_history else "eagle"


def depth(strategy: Strategy) -> int:
    """Most draft tokens one row can accept in a round of ``strategy``."""
    return strategy.max_accept_length - 1


def contains(big: Strategy, small: Strategy) -> bool:
    """True when every tree ``small`` drafts is part of the tree ``big`` drafts (same source, no part smaller)."""
    return family(big) == family(small) and all(
        getattr(big, name) >= getattr(small, name) for name in ("steps", "topk", "num_draft_tokens", "history_nodes")
    )


@dataclass
class DepthCounts:
    """Decayed hits and trials per depth (index 0 = depth 1) of one arm."""

    hits: list[float]
    trials: list[float]

    @classmethod
    def empty(cls, steps: int) -> DepthCounts:
        return cls([0.0] * steps, [0.0] * steps)


class DepthAcceptance:
    """Per-arm, per-depth acceptance counts for speculative arms, and the tokens per row each arm is predicted to
    emit (see the module docstring)."""

    def __init__(self, arms: list[Strategy], prior_rows: float, memory_rounds: float) -> None:
        self.prior_rows = prior_rows
        self.memory_rounds = memory_rounds
        self.counts = {arm: DepthCounts.empty(depth(arm)) for arm in arms if not arm.is_disabled}
        # containment, once: choose() asks for every arm's prediction every round
        self._holders = {arm: [o for o in self.counts if contains(o, arm)] for arm in self.counts}
        self._held = {arm: [o for o in self.counts if contains(arm, o)] for arm in self.counts}
        self._tokens: dict[tuple[Strategy, float], float] = {}  # path tokens, until the next observation
        self._estimated: dict[Strategy, list[tuple[float, float]]] = {}  # per-depth estimates, likewise

    def observe(self, stats: RoundStats) -> None:
        """Count one round's rows (a strategy outside the arms, or plain decoding, teaches nothing)."""
        self._tokens.clear()
        self._estimated.clear()
        keep = math.exp(-1.0 / self.memory_rounds)
        for every in self.counts.values():  # all arms forget, so an arm left alone regains its uncertainty
            every.hits = [h * keep for h in every.hits]
            every.trials = [t * keep for t in every.trials]
        counts = self.counts.get(stats.strategy)
        if counts is None:
            return
        steps = len(counts.hits)
        for accepted in stats.accepted_tokens:
            for d in range(min(accepted, steps)):
                counts.hits[d] += 1.0
                counts.trials[d] += 1.0
            if accepted < steps:
                counts.trials[accepted] += 1.0

    def rows(self, arm: Strategy) -> float:
        """Decayed rows the arm's own estimate rests on (its trials at depth 1)."""
        counts = self.counts.get(arm)
        return counts.trials[0] if counts else 0.0

    def hazards(self, arm: Strategy, z: float = 0.0) -> list[float]:
        """The arm's hit probability at each depth given a hit at the one before, each raised by ``z`` of its own
        standard errors (of the rows it rests on: its own, the prior's weight and ``BASE_ROWS``). [steps]"""
        return [min(1.0, mean + z * math.sqrt(mean * (1.0 - mean) / (n + 1.0))) for mean, n in self._estimates(arm)]

    def _estimates(self, arm: Strategy) -> list[tuple[float, float]]:
        """(hazard, rows it rests on) per depth. [steps]"""
        if arm in self._estimated:
            return self._estimated[arm]
        own = self.counts[arm]
        pooled = [self.counts[other] for other in self._holders[arm]]
        out = []
        for d in range(len(own.hits)):
            hits = sum(c.hits[d] for c in pooled)
            trials = sum(c.trials[d] for c in pooled)
            prior = (hits + 0.5 * BASE_ROWS) / (trials + BASE_ROWS)
            weight = self.prior_rows * trials / (trials + self.prior_rows)  # a prior only as firm as its data
            n = own.trials[d] + weight + BASE_ROWS
            out.append(((own.hits[d] + weight * prior + 0.5 * BASE_ROWS) / n, n))
        self._estimated[arm] = out
        return out

    def tokens_per_row(self, arm: Strategy, z: float = 0.0) -> float:
        """Expected tokens a row emits in one round of ``arm`` (1.0 for plain decoding), raised by ``z`` standard
        errors of that expectation; at least what any arm whose tree it contains is expected to emit (a larger tree
        keeps the smaller's nodes)."""
        if arm.is_disabled:
            return 1.0
        return max(self._path_tokens(other, z) for other in self._held[arm])

    def _path_tokens(self, arm: Strategy, z: float) -> float:
        """1 + sum_d prod_{j<=d} h_j, plus ``z`` times its standard error (delta method over independent hazards:
        d tokens / d h_j = sum_{d>=j} prod_{i<=d} h_i / h_j): one bound on the whole path, not one per depth, so a
        deep tree is not made optimistic depth after depth."""
        if (arm, z) not in self._tokens and self.rows(arm) < self.prior_rows:  # a guess: every depth optimistic
            alive, total = 1.0, 1.0
            for hazard in self.hazards(arm, z):
                alive *= hazard
                total += alive
            self._tokens[(arm, z)] = total
        if (arm, z) not in self._tokens:
            estimates = self._estimates(arm)
            alive, survival = 1.0, []
            for hazard, _ in estimates:
                alive *= hazard
                survival.append(alive)
            total, variance, tail = 1.0 + sum(survival), 0.0, sum(survival)
            for (hazard, n), reached in zip(estimates, survival, strict=True):
                if hazard > 0.0:
                    variance += (tail / hazard) ** 2 * hazard * (1.0 - hazard) / (n + 1.0)
                tail -= reached
            self._tokens[(arm, z)] = total + z * math.sqrt(variance)
        return self._tokens[(arm, z)]

    def state(self) -> dict:
        """Plain-data snapshot: {arm: [hits, trials]}."""
        return {str(arm): [c.hits, c.trials] for arm, c in self.counts.items()}

    def load(self, state: dict) -> None:
        """Restore the counts of the arms ``state`` shares with this estimator (others start empty)."""
        self._tokens.clear()
        self._estimated.clear()
        for arm, counts in self.counts.items():
            saved = state.get(str(arm))
            if saved is not None and len(saved[0]) == len(counts.hits):
                counts.hits, counts.trials = [float(h) for h in saved[0]], [float(t) for t in saved[1]]
