"""Tokens per round of every arm, predicted from what any arm observed: per-depth acceptance shared by one source.

A request row of a speculative round accepts drafted tokens depth by depth until the first miss, so a round of a
``steps``-deep strategy that accepted ``a`` tokens is ``a`` hits at depths 1..a and, when ``a < steps``, one miss at
depth ``a + 1`` (a chain that stopped early counts its stop as that miss: its hazard is the chance of going on,
drafted and accepted, which is what its tokens per round follow). The chance of a hit at depth ``d`` given a hit at
``d - 1`` (the depth's hazard) hardly depends on the batch size, and arms drafted by one source share it closely:
every EAGLE chain ``S_1_S+1`` follows the same greedy chain (the chains with one stop pool their rows outright, down
to the depth each drafts), and a larger tree only raises it.
So each arm's hazard at a depth is its own hits over its own trials, shrunk with a weight of at most ``prior_rows``
rows that fades as the arm's own rows accumulate (``prior_rows / (prior_rows + own rows)`` of it) toward what the
arms of its source that its tree contains or that contain it say: the pooled hazard while the arm has no rows there,
then its own rate held between the two sides' pooled hazards (the smaller trees' a lower bound, the larger ones' an
upper bound). A bound pulls only an own rate beyond it: a 32-node tree whose first rows fell short is lifted to
the 16-node tree it holds, but a chain's low hazards do not drag down a wide tree that accepts deeper. Where neither
the arm nor its pool has rows at a depth, the hazard is the one at the depth before (``BASE_ROWS`` rows of weight; at
depth 1 the drafter's own held-out chain hazard when its checkpoint records one, ``set_prior_hazard``, else 1/2): a
drafter that misses at depth 1 is not assumed to hit half the time at depth 5. An arm is predicted never below an
arm whose tree it contains, and its optimistic bound lies above that floor by its own standard error.

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

import numpy as np

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


class DepthAcceptance:
    """Per-arm, per-depth acceptance counts for speculative arms, and the tokens per row each arm is predicted to
    emit (see the module docstring).

    The counts are one array over arms x (hits, trials) x depths, so a round's forgetting and the sums over every
    arm's twins and pool are single array operations; the per-depth estimates and path sums, a few dozen numbers per
    arm, run on Python floats (beside a model's forward, a small array operation costs more than that arithmetic).
    Every arm's estimates and tokens per row are computed once per learned round (``choose`` asks for them all; the
    bandit learns the rounds a stretch queued at its next decision)."""

    def __init__(self, arms: list[Strategy], prior_rows: float, memory_rows: float) -> None:
        self.prior_rows = prior_rows
        self.memory_rows = memory_rows
        self.arms = [arm for arm in arms if not arm.is_disabled]
        self._index = {arm: i for i, arm in enumerate(self.arms)}
        self._depths = [depth(arm) for arm in self.arms]
        self._columns = max(self._depths, default=1)
        # [A, 2D]: decayed hits at each depth, then decayed trials (index 0 = depth 1); 0 past an arm's depth
        self.counts = np.zeros((len(self.arms), 2 * self._columns))
        # containment, once: row = the arm estimated, column = an arm whose counts it takes
        self._twins = _relation(self.arms, lambda arm, other: twins(other, arm))  # [A, A] 0/1
        self._pool = _relation(self.arms, _prior_for)  # [A, A] 0/1
        # the pool's lower side: arms the row's tree holds (a lower bound on its hazards); the rest bound it above
        self._below = _relation(self.arms, lambda arm, other: _prior_for(arm, other) and contains(arm, other))
        self._held = [[j for j, other in enumerate(self.arms) if contains(arm, other)] for arm in self.arms]
        self._prior_hazard = dict.fromkeys(("eagle", "history", "hybrid"), UNKNOWN_HAZARD)
        self._keep: dict[tuple[int | None, int], np.ndarray] = {}  # [A, 1] decay factors by (arm run, batch size)
        # until the next observation: per arm (hazard, rows it rests on) per depth, and its own rows
        self._estimated: tuple[list[list[tuple[float, float]]], list[float]] | None = None
        self._tokens: dict[float, list[float]] = {}  # per-arm tokens per row by z, likewise
        self._paths: dict[float, list[float]] = {}  # per-arm path tokens by z (``_path_tokens``), likewise

    def set_prior_hazard(self, hazard: float) -> None:
        """Start the drafter's arms (EAGLE and hybrid) from ``hazard`` per depth instead of 1/2: the drafter's
        held-out greedy-chain hazard (``geometric_hazard``), so the first rounds know roughly what it accepts."""
        if not 0.0 <= hazard <= 1.0:
            raise ValueError(f"prior hazard must lie in [0, 1], got {hazard!r}")
        self._prior_hazard["eagle"] = self._prior_hazard["hybrid"] = float(hazard)
        self._forget_estimates()

    def observe(self, stats: RoundStats) -> None:
        """Count one round's rows (a strategy outside the arms, or plain decoding, teaches nothing)."""
        self._forget_estimates()
        arm = self._index.get(stats.strategy)
        self.counts *= self._decay(arm, stats.batch_size)
        if arm is None:
            return
        steps, columns = self._depths[arm], self._columns
        stopped = [0] * (steps + 1)  # rows by accepted tokens (at most steps)
        for accepted in stats.accepted_tokens:
            stopped[min(accepted, steps)] += 1
        added = [0.0] * (2 * columns)
        reached = 0  # rows that accepted at least d tokens: a hit at depth d, and a trial at depth d + 1
        for d in range(steps, -1, -1):
            reached += stopped[d]
            if d > 0:
                added[d - 1] = reached
            if d < steps:
                added[columns + d] = reached
        self.counts[arm] += added

    def _decay(self, arm: int | None, batch_size: int) -> np.ndarray:
        """What a round of ``arm`` (None: no arm's) over ``batch_size`` rows leaves of every arm's counts: an arm's
        newer rows replace its older ones; idle arms forget slowly. -> [A, 1]"""
        key = (arm, batch_size)
        if key not in self._keep:
            idle = math.exp(-batch_size / (IDLE_MEMORY * self.memory_rows))
            ran = math.exp(-batch_size / self.memory_rows) if arm is not None else idle
            running = self._twins[arm] > 0 if arm is not None else np.zeros(len(self.arms), dtype=bool)
            self._keep[key] = np.where(running, ran, idle)[:, None]
        return self._keep[key]

    def rows(self, arm: Strategy) -> float:
        """Decayed rows the arm's own estimate rests on (its and its twin chains' trials at depth 1)."""
        index = self._index.get(arm)
        return 0.0 if index is None else self._estimates()[1][index]

    def hazards(self, arm: Strategy, z: float = 0.0) -> list[float]:
        """The arm's hit probability at each depth given a hit at the one before, each raised by ``z`` of its own
        standard errors (of the rows it rests on: its own, the prior's weight and ``BASE_ROWS``). [steps]"""
        return [_raised(mean, n, z) for mean, n in self._estimates()[0][self._index[arm]]]

    def _estimates(self) -> tuple[list[list[tuple[float, float]]], list[float]]:
        """Per arm, (hazard, rows it rests on) per depth: own rows, the pool's (at most ``prior_rows``) and
        ``BASE_ROWS`` of the depth before's hazard; and the arm's own rows."""
        if self._estimated is None:
            pooled_counts, below_counts = self._pool @ self.counts, self._below @ self.counts  # [A, 2D]
            own, pooled = (self._twins @ self.counts).tolist(), pooled_counts.tolist()  # A x [2D]
            below, above = below_counts.tolist(), (pooled_counts - below_counts).tolist()
            columns, prior_rows = self._columns, self.prior_rows
            estimates, rows = [], []
            for i, arm in enumerate(self.arms):
                own_i, pooled_i, below_i, above_i = own[i], pooled[i], below[i], above[i]  # this arm's rows, bound once
                before = pooled_before = self._prior_hazard[family(arm)]
                out = []
                for d in range(self._depths[i]):
                    own_hits, own_trials = own_i[d], own_i[columns + d]
                    hits, trials = pooled_i[d], pooled_i[columns + d]
                    prior = (hits + pooled_before * BASE_ROWS) / (trials + BASE_ROWS)
                    weight = 0.0  # a prior only as firm as its data, and fading as the arm's own rows accumulate
                    if prior_rows > 0:
                        weight = prior_rows * trials / (trials + prior_rows) * prior_rows / (prior_rows + own_trials)
                    n = own_trials + weight + BASE_ROWS
                    target = prior
                    if own_trials > 0.0:  # the pool bounds the arm's own rate, on each side from its own arms
                        below_trials, above_trials = below_i[columns + d], above_i[columns + d]
                        low = below_i[d] / below_trials if below_trials > 0.0 else 0.0
                        high = above_i[d] / above_trials if above_trials > 0.0 else 1.0
                        target = min(max(own_hits / own_trials, low), max(high, low))
                    before = (own_hits + weight * target + before * BASE_ROWS) / n
                    pooled_before = prior
                    out.append((before, n))
                estimates.append(out)
                rows.append(own_i[columns])
            self._estimated = estimates, rows
        return self._estimated

    def tokens_per_row(self, arm: Strategy, z: float = 0.0) -> float:
        """Expected tokens a row emits in one round of ``arm`` (1.0 for plain decoding), at least what any arm whose
        tree it contains is expected to emit (a larger tree keeps the smaller's nodes), raised by ``z`` of the arm's
        own standard errors. The floor lifts the expectation, not the uncertainty: a larger tree whose few rows fell
        short is predicted as the smaller one it holds, and its bound stays above that by its own error (were the
        floor the smaller tree's bound, the larger could never look better than it and would not be tried again)."""
        if arm.is_disabled:
            return 1.0
        if z not in self._tokens:
            mean, raised = self._path_tokens(0.0), self._path_tokens(z)
            self._tokens[z] = [max(mean[j] for j in held) + raised[i] - mean[i] for i, held in enumerate(self._held)]
        return self._tokens[z][self._index[arm]]

    def _path_tokens(self, z: float) -> list[float]:
        """Per arm, 1 + sum_d prod_{j<=d} h_j, plus ``z`` times its standard error (delta method over independent
        hazards: d tokens / d h_j = sum_{d>=j} prod_{i<=d} h_i / h_j): one bound on the whole path, not one per
        depth, so a deep tree is not made optimistic depth after depth; an arm whose own rows are fewer than
        ``prior_rows`` is a guess, every depth raised."""
        if z in self._paths:
            return self._paths[z]
        estimates, rows = self._estimates()
        out = []
        for per_depth, own_rows in zip(estimates, rows, strict=True):
            alive, total = 1.0, 1.0
            if own_rows < self.prior_rows:
                for mean, n in per_depth:
                    alive *= _raised(mean, n, z) if z != 0.0 else min(1.0, mean)  # _raised's value at z = 0
                    total += alive
                out.append(total)
                continue
            survival = []
            for mean, _ in per_depth:
                alive *= mean
                survival.append(alive)
            tail = sum(survival)
            total, variance = 1.0 + tail, 0.0
            for (hazard, n), reached in zip(per_depth, survival, strict=True):
                if hazard > 0.0:
                    variance += (tail / hazard) ** 2 * hazard * (1.0 - hazard) / (n + 1.0)
                tail -= reached
            out.append(total + z * math.sqrt(variance))
        self._paths[z] = out
        return out

    def state(self) -> dict:
        """Plain-data snapshot: {arm: [hits, trials]} (one entry per depth the arm drafts)."""
        columns = self._columns
        return {
            str(arm): [self.counts[i, :steps].tolist(), self.counts[i, columns : columns + steps].tolist()]
            for i, (arm, steps) in enumerate(zip(self.arms, self._depths, strict=True))
        }

    def load(self, state: dict) -> None:
        """Restore the counts of the arms ``state`` shares with this estimator (others start empty)."""
        self._forget_estimates()
        self.counts[:] = 0.0
        columns = self._columns
        for i, (arm, steps) in enumerate(zip(self.arms, self._depths, strict=True)):
            saved = state.get(str(arm))
            if saved is not None and len(saved[0]) == steps:
                hits, trials = [float(h) for h in saved[0]], [float(t) for t in saved[1]]
                if len(trials) != steps or not all(0.0 <= h <= t < math.inf for h, t in zip(hits, trials, strict=True)):
                    raise ValueError(
                        f"acceptance of {arm}: expected {steps} counts with 0 <= hits <= trials, got {saved}"
                    )
                self.counts[i, :steps] = hits
                self.counts[i, columns : columns + steps] = trials

    def _forget_estimates(self) -> None:
        self._estimated = None
        self._tokens.clear()
        self._paths.clear()


def _raised(mean: float, n: float, z: float) -> float:
    """A hazard raised by ``z`` standard errors of ``n`` rows, at most 1."""
    return min(1.0, mean + z * math.sqrt(max(mean * (1.0 - mean), 0.0) / (n + 1.0)))


def _relation(arms: list[Strategy], related) -> np.ndarray:
    """[A, A] matrix, 1.0 where ``related(arms[row], arms[column])``."""
    rows = [[1.0 if related(arm, other) else 0.0 for other in arms] for arm in arms]
    return np.array(rows, dtype=float).reshape(len(arms), len(arms))


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
