"""Tokens per round of every arm, predicted from what any arm observed: per-depth acceptance shared by one source.

A request row of a speculative round accepts drafted tokens depth by depth until the first miss, so a round of a
``steps``-deep strategy that accepted ``a`` tokens is ``a`` hits at depths 1..a and, when ``a < steps``, one miss at
depth ``a + 1`` (a chain that stopped early counts its stop as that miss: its hazard is the chance of going on,
drafted and accepted, which is what its tokens per round follow). The chance of a hit at depth ``d`` given a hit at
``d - 1`` (the depth's hazard) hardly depends on the batch size, and arms drafted by one source share it closely:
every EAGLE chain ``S_1_S+1`` follows the same greedy chain (the chains with one stop pool their rows outright, down
to the depth each drafts), and a larger tree only raises it.
So each arm's hazard at a depth is its own hits over its own trials, shrunk toward the pooled hazard of the arms of
its source that its tree contains or that contain it (a larger tree an upper bound, a smaller one a lower bound),
with a weight of at most ``prior_rows`` rows that fades as the arm's own rows accumulate (``prior_rows / (prior_rows
+ own rows)`` of it): an arm's own rows, once it has some, outweigh its family's. Where neither the arm nor its pool
has rows at a depth, the hazard is the one at the depth before (``BASE_ROWS`` rows of weight; at depth 1 the
drafter's own held-out chain hazard when its checkpoint records one, ``set_prior_hazard``, else 1/2): a drafter that
misses at depth 1 is not assumed to hit half the time at depth 5. An arm is predicted never below an
arm whose tree it contains.

Evidence is forgotten as newer evidence of the same arm replaces it: a round of ``b`` rows of an arm (or of a
chain, for the chains) decays its counts by exp(-b / ``memory_rows``), so the estimate follows an acceptance that
drifts as the drafter and policy train, or along the rollouts (the long tail's last tokens, decoded at batch 1, are
easier than its first at batch 64: memory counted in rounds let 64-row rounds outweigh a hundred 1-row ones); every
other round decays them ``IDLE_MEMORY`` times more slowly, so an arm left alone regains its uncertainty (and is
tried again) only after many rows, not after a few dozen plain rounds. Expected
tokens per row = 1 + sum_d prod_{j<=d} h_j; the optimistic value raises that expectation by ``z`` of its standard
errors (the exploration bound: an arm with few rounds at the deep levels may still be much better than its mean
says).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import Strategy

BASE_ROWS = 2.0
"""Weight (rows) of the hazard of the depth before (the prior hazard at depth 1) that a depth's estimate is shrunk
toward."""
UNKNOWN_HAZARD = 0.5
"""Depth-1 prior hazard of a source nothing is known about."""
IDLE_MEMORY = 8.0
"""How many times more slowly an arm's counts decay over other arms' rows (plain ones included) than over its
own."""


def family(strategy: Strategy) -> str:
    """The arms whose drafts come from the same source: ``eagle``, ``history`` or ``hybrid``."""
    if strategy.is_hybrid:
        return "hybrid"
    return "history" if strategy.is_history else "eagle"


def depth(strategy: Strategy) -> int:
    """Most draft tokens one row can accept in a round of ``strategy``."""
    return strategy.max_accept_length - 1


def is_chain(strategy: Strategy) -> bool:
    """True for an EAGLE chain (``S_1_S+1``, with or without a confidence stop): every chain drafts the same greedy
    path, so all chains with the same stop measure one hazard per depth."""
    return not strategy.is_history and strategy.topk == 1 and strategy.num_draft_tokens == strategy.steps + 1


def twins(a: Strategy, b: Strategy) -> bool:
    """True when rounds of ``a`` and ``b`` are the same rounds down to the depth each drafts: the same arm, or two
    chains with the same stop (none, or the same ``P``: their stopping decisions agree level by level)."""
    return a == b or (is_chain(a) and is_chain(b) and a.stop_below == b.stop_below)


def contains(big: Strategy, small: Strategy) -> bool:
    """True when every tree ``small`` drafts is part of the tree ``big`` drafts (same source, no part smaller). A
    chain that stops early holds only the same stop's shorter chains: a fixed chain or tree of any size may reach
    deeper than it does."""
    if big.stops_early and not (small.stops_early and small.stop_below == big.stop_below):
        return False
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

    def __init__(self, arms: list[Strategy], prior_rows: float, memory_rows: float) -> None:
        self.prior_rows = prior_rows
        self.memory_rows = memory_rows
        self.counts = {arm: DepthCounts.empty(depth(arm)) for arm in arms if not arm.is_disabled}
        # containment, once: choose() asks for every arm's prediction every round
        self._pool = {arm: tuple(o for o in self.counts if _prior_for(arm, o)) for arm in self.counts}
        # chains with one stop share their rows outright (one greedy path), down to the depth each drafts
        self._twins = {arm: tuple(o for o in self.counts if twins(o, arm)) for arm in self.counts}
        self._held = {arm: [o for o in self.counts if contains(arm, o)] for arm in self.counts}
        self._tokens: dict[tuple[Strategy, float], float] = {}  # path tokens, until the next observation
        self._estimated: dict[Strategy, list[tuple[float, float]]] = {}  # per-depth estimates, likewise
        self._rows: dict[Strategy, float] = {}  # rows each arm's estimate rests on, likewise
        self._sums: dict[tuple[int, int], list[tuple[float, float]]] = {}  # counts summed by (id(pool), steps), too
        self._prior_hazard = dict.fromkeys(("eagle", "history", "hybrid"), UNKNOWN_HAZARD)

    def set_prior_hazard(self, hazard: float) -> None:
        """Start the drafter's arms (EAGLE and hybrid) from ``hazard`` per depth instead of 1/2: the drafter's
        held-out greedy-chain hazard (``geometric_hazard``), so the first rounds know roughly what it accepts."""
        if not 0.0 <= hazard <= 1.0:
            raise ValueError(f"prior hazard must lie in [0, 1], got {hazard!r}")
        self._prior_hazard["eagle"] = self._prior_hazard["hybrid"] = float(hazard)
        self._tokens.clear()
        self._estimated.clear()
        self._rows.clear()
        self._sums.clear()

    def observe(self, stats: RoundStats) -> None:
        """Count one round's rows (a strategy outside the arms, or plain decoding, teaches nothing)."""
        self._tokens.clear()
        self._estimated.clear()
        self._rows.clear()
        self._sums.clear()
        ran = self._twins.get(stats.strategy, [])
        for arm, every in self.counts.items():  # an arm's newer rows replace its older ones; idle arms forget slowly
            memory = self.memory_rows if arm in ran else IDLE_MEMORY * self.memory_rows
            keep = math.exp(-stats.batch_size / memory)
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
        """Decayed rows the arm's own estimate rests on (its and its twin chains' trials at depth 1)."""
        if arm not in self.counts:
            return 0.0
        if arm not in self._rows:
            self._rows[arm] = sum(self.counts[twin].trials[0] for twin in self._twins[arm])
        return self._rows[arm]

    def hazards(self, arm: Strategy, z: float = 0.0) -> list[float]:
        """The arm's hit probability at each depth given a hit at the one before, each raised by ``z`` of its own
        standard errors (of the rows it rests on: its own, the prior's weight and ``BASE_ROWS``). [steps]"""
        return [min(1.0, mean + z * math.sqrt(mean * (1.0 - mean) / (n + 1.0))) for mean, n in self._estimates(arm)]

    def _estimates(self, arm: Strategy) -> list[tuple[float, float]]:
        """(hazard, rows it rests on) per depth: own rows, the pool's (at most ``prior_rows``), and ``BASE_ROWS`` of
        the depth before's hazard. [steps]"""
        if arm in self._estimated:
            return self._estimated[arm]
        steps = len(self.counts[arm].hits)
        own, pooled = self._sums_over(self._twins[arm], steps), self._sums_over(self._pool[arm], steps)
        out, before = [], self._prior_hazard[family(arm)]
        pooled_before = before
        for d in range(steps):
            (own_hits, own_trials), (hits, trials) = own[d], pooled[d]
            prior = (hits + pooled_before * BASE_ROWS) / (trials + BASE_ROWS)
            # a prior only as firm as its data, and fading as the arm's own rows accumulate
            weight = self.prior_rows * trials / (trials + self.prior_rows)
            weight *= self.prior_rows / (self.prior_rows + own_trials) if self.prior_rows > 0 else 0.0
            n = own_trials + weight + BASE_ROWS
            before = (own_hits + weight * prior + before * BASE_ROWS) / n
            pooled_before = prior
            out.append((before, n))
        self._estimated[arm] = out
        return out

    def _sums_over(self, arms: tuple[Strategy, ...], steps: int) -> list[tuple[float, float]]:
        """`_summed` over these arms' counts (one of the fixed `_pool` / `_twins` tuples), once per observation.
        [steps]"""
        key = (id(arms), steps)
        if key not in self._sums:
            self._sums[key] = _summed([self.counts[arm] for arm in arms], steps)
        return self._sums[key]

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
        self._rows.clear()
        self._sums.clear()
        for arm, counts in self.counts.items():
            saved = state.get(str(arm))
            if saved is not None and len(saved[0]) == len(counts.hits):
                counts.hits, counts.trials = [float(h) for h in saved[0]], [float(t) for t in saved[1]]


def geometric_hazard(steps: int, tokens: float) -> float:
    """The constant per-depth hazard ``h`` under which a ``steps``-deep chain emits ``tokens`` per row and round
    (1 + h + ... + h^steps = tokens), by bisection; ``tokens`` is clipped to [1, steps + 1]."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    target = min(max(tokens, 1.0), steps + 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**d for d in range(steps + 1)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _prior_for(arm: Strategy, other: Strategy) -> bool:
    """True when ``other``'s rows are a prior for ``arm``'s hazards: one tree contains the other; for a chain that
    stops early, also every fixed chain (at each depth both reach, going on is no likelier than a fixed chain's hit,
    so they are an optimistic prior). A stopping chain's rows, which count its stops as misses, are no prior for an
    arm that does not stop."""
    if arm.stops_early and is_chain(arm) and is_chain(other) and not other.stops_early:
        return True
    return (contains(other, arm) or contains(arm, other)) and arm.stops_early >= other.stops_early


def _summed(counts: list[DepthCounts], steps: int) -> list[tuple[float, float]]:
    """Hits and trials at each depth index below ``steps``, summed over the arms that draft that deep. [steps]"""
    hits, trials = [0.0] * steps, [0.0] * steps
    for c in counts:
        for d in range(min(steps, len(c.hits))):
            hits[d] += c.hits[d]
            trials[d] += c.trials[d]
    return list(zip(hits, trials, strict=True))
