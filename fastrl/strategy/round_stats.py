"""What decode rounds did: `RoundStats`, the record the engine hands to ``StrategySelector.observe`` after every
round, and `RoundTotals`, the one place where rounds are summed into accept lengths, rates and goodput (telemetry,
selectors, rollout workers and RL metrics all use it)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass

from fastrl.json_values import is_integral
from fastrl.strategy.strategy import Strategy

MIN_WALL_TIME_S = 1e-9
"""Shortest round a ``RoundStats`` may report (the engine floors its measured times here): a shorter one is no
measurement, and its goodput (tokens / seconds) overflows to infinity in the selectors' state, which no JSON holds."""
MAX_WALL_TIME_S = 1e9
"""Longest round (or part of one) a ``RoundStats`` may report, 31 years: sums of such times stay finite."""


@dataclass
class RoundStats:
    """Statistics of one decode round over ``batch_size`` running requests (one list entry per request row).

    ``drafted_tokens``: draft tokens verified per row (0 for plain decoding). ``accepted_tokens``: draft tokens the
    policy accepted per row. ``emitted_tokens``: tokens appended per row, normally ``accepted + 1`` (the policy adds
    one of its own), fewer where a request stopped inside the accepted path. Times are seconds; ``draft_time_s``
    and ``verify_time_s`` are optional parts of ``wall_time_s`` (0 when not measured, and for plain rounds).
    ``plain_time_estimate_s``: the estimated wall time plain decoding would have needed for the tokens this round
    emitted (the selector's cost model fills it in; 0 when no estimate was made). ``catch_up_time_s``: the part of
    ``wall_time_s`` the round spent catching up on text emitted before it: a history round indexing what came since
    its groups' last history draft, a drafter round after rounds without the drafter feeding it their tokens (the
    engine times that catch-up only then), a round without the drafter whose rows' unread text reached the engine's
    ``drafter_backlog`` having the drafter read it first. A cost of the rounds that went before as much as of this
    one, which the bandit does not learn as this arm's. ``context_tokens``: the keys the rows held before the round,
    summed over rows (what its attention reads; 0 when not recorded), which a round's time grows with.
    ``after_other_arm``: the engine's decode round before this one ran another strategy (on a CPU a plain round then
    finds less of the policy in the processor's caches and costs more than one after plain rounds).
    ``drafter_backlog``: after the round, the entries a drafter round over its rows would first catch up on (the
    text rounds without the drafter emitted, less what a backlog limit had the drafter read already; None when the
    engine has no drafter or did not say). ``chain_depth``: a stopping chain's levels drafted, without a hybrid's
    history nodes (None: another strategy, or not recorded; ``stopped_depth`` reads both).
    """

    strategy: Strategy
    batch_size: int
    drafted_tokens: list[int]
    accepted_tokens: list[int]
    emitted_tokens: list[int]
    wall_time_s: float
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    plain_time_estimate_s: float = 0.0
    catch_up_time_s: float = 0.0
    context_tokens: int = 0
    after_other_arm: bool = False
    drafter_backlog: int | None = None
    chain_depth: int | None = None

    def __post_init__(self) -> None:
        if not is_integral(self.batch_size) or self.batch_size < 1:
            raise ValueError(f"RoundStats.batch_size must be an integer >= 1, got {self.batch_size!r}")
        for name in ("drafted_tokens", "accepted_tokens", "emitted_tokens"):
            _check_counts(name, getattr(self, name), self.batch_size)
        for row, (a, d) in enumerate(zip(self.accepted_tokens, self.drafted_tokens, strict=True)):
            if a > d:
                raise ValueError(f"RoundStats.accepted_tokens[{row}] is {a}, more than drafted_tokens[{row}] = {d}")
        wall = self.wall_time_s
        if not (_is_number(wall) and MIN_WALL_TIME_S <= wall <= MAX_WALL_TIME_S):
            bounds = f"[{MIN_WALL_TIME_S:g}, {MAX_WALL_TIME_S:g}]"
            raise ValueError(f"RoundStats.wall_time_s must be a number of seconds in {bounds}, got {wall!r}")
        for name in ("draft_time_s", "verify_time_s", "plain_time_estimate_s"):
            value = getattr(self, name)
            if not (_is_number(value) and 0.0 <= value <= MAX_WALL_TIME_S):
                raise ValueError(
                    f"RoundStats.{name} must be a number of seconds in [0, {MAX_WALL_TIME_S:g}], got {value!r}"
                )
        if not (_is_number(self.catch_up_time_s) and 0.0 <= self.catch_up_time_s < wall):
            bound = f"[0, wall_time_s = {wall})"
            raise ValueError(f"RoundStats.catch_up_time_s must be in {bound}, got {self.catch_up_time_s!r}")
        if not is_integral(self.context_tokens) or self.context_tokens < 0:
            raise ValueError(f"RoundStats.context_tokens must be an integer >= 0, got {self.context_tokens!r}")
        if not isinstance(self.after_other_arm, bool):
            raise ValueError(f"RoundStats.after_other_arm must be a bool, got {self.after_other_arm!r}")
        backlog = self.drafter_backlog
        if backlog is not None and (not is_integral(backlog) or backlog < 0):
            raise ValueError(f"RoundStats.drafter_backlog must be None or an integer >= 0, got {backlog!r}")
        depth = self.chain_depth
        if depth is not None and (
            not self.strategy.stops_early or not is_integral(depth) or not 1 <= depth <= self.strategy.steps
        ):
            raise ValueError(
                "RoundStats.chain_depth must be None, or for a stopping chain an integer in "
                f"[1, {self.strategy.steps}] (its levels), got {depth!r} for {self.strategy}"
            )

    @property
    def stopped_depth(self) -> int | None:
        """A stopping chain's levels drafted this round: ``chain_depth``, or where a round did not record it, the
        drafted tokens of a chain with no history part (its nodes are its levels); None for other strategies."""
        if not self.strategy.stops_early:
            return None
        if self.chain_depth is not None:
            return self.chain_depth
        return self.drafted_tokens[0] if self.drafted_tokens and not self.strategy.is_history else None

    @property
    def mean_context(self) -> float | None:
        """Keys per row the round attended over (None when not recorded)."""
        return self.context_tokens / self.batch_size if self.context_tokens else None

    @property
    def own_time_s(self) -> float:
        """The round's wall time less its catch-up: what the round's own strategy cost (the catch-up reads text
        emitted before it; a plain engine, which has no drafter to feed, never pays it)."""
        return self.wall_time_s - self.catch_up_time_s

    @property
    def total_emitted(self) -> int:
        """Tokens the round appended over all rows."""
        return sum(self.emitted_tokens)

    @property
    def mean_accept_length(self) -> float:
        """Mean tokens per row the round produced (1.0 for plain decoding); see `accept_length`."""
        return accept_length(self.total_emitted, self.batch_size)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens over all rows (0.0 when nothing was drafted)."""
        return RoundTotals.of([self]).acceptance_rate

    @property
    def goodput(self) -> float:
        """Emitted tokens per second of round wall time."""
        return self.total_emitted / self.wall_time_s


def _is_number(value: object) -> bool:
    """A finite real number (a Python or numpy float or int), not a ``bool``."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _check_counts(name: str, values: object, rows: int) -> None:
    """ValueError naming ``RoundStats.<name>`` unless it holds one integer >= 0 per row."""
    if not isinstance(values, list | tuple) or len(values) != rows:
        got = f"{len(values)} rows" if isinstance(values, list | tuple) else repr(values)
        raise ValueError(f"RoundStats.{name} must be a list of one count per row (batch_size {rows}), got {got}")
    if all(type(value) is int for value in values) and min(values, default=0) >= 0:
        return  # Python ints >= 0, as the engine's rounds give them: one pass, no per-value ABC check
    for row, value in enumerate(values):
        if not is_integral(value) or value < 0:
            raise ValueError(f"RoundStats.{name}[{row}] must be an integer >= 0, got {value!r}")


def accept_length(emitted: int, rows: int) -> float:
    """The accept length: mean tokens a round added to a request, emitted tokens / rows (0.0 for no rows).

    A row's tokens are its accepted drafts + 1, cut where its request finished (EOS, a stop id, its token budget):
    drafts the policy accepted past that point were never emitted, and counting them would read the last round of
    every request as better than any of its text (the literature's "tokens per round" counts them out too). The
    drafter's uncut agreement is `acceptance_rate` and `RoundStats.accepted_tokens`, what selectors learn from.
    """
    return emitted / rows if rows else 0.0


def pooled_accept_length(parts: Iterable[tuple[float, float]]) -> float:
    """The accept length of several parts (steps, rounds) taken together, each part as (its accept length, its
    rows): the whole's emitted tokens over its rows, not a mean of the parts' figures."""
    pairs = list(parts)
    return accept_length(sum(length * rows for length, rows in pairs), sum(rows for _, rows in pairs))


@dataclass
class RoundTotals:
    """Sums over decode rounds, and the aggregates every report derives from them."""

    rounds: int = 0
    rows: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    wall_time_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    plain_time_estimate_s: float = 0.0
    estimated_rounds: int = 0
    estimated_wall_time_s: float = 0.0

    @classmethod
    def of(cls, stats: Iterable[RoundStats]) -> RoundTotals:
        totals = cls()
        for s in stats:
            totals.add(s)
        return totals

    def add(self, s: RoundStats) -> None:
        """Count one round."""
        self.rounds += 1
        self.rows += s.batch_size
        self.drafted += sum(s.drafted_tokens)
        self.accepted += sum(s.accepted_tokens)
        self.emitted += sum(s.emitted_tokens)
        self.wall_time_s += s.wall_time_s
        self.draft_time_s += s.draft_time_s
        self.verify_time_s += s.verify_time_s
        if s.plain_time_estimate_s > 0.0:
            self.estimated_rounds += 1
            self.estimated_wall_time_s += s.wall_time_s
            self.plain_time_estimate_s += s.plain_time_estimate_s

    @property
    def mean_accept_length(self) -> float:
        """Row-weighted accept length (see `accept_length`); 0.0 when no rounds were counted."""
        return accept_length(self.emitted, self.rows)

    @property
    def mean_accepted_drafts(self) -> float:
        """Row-weighted draft tokens the policy accepted per round, uncut where a request finished (0.0 without
        rounds): the drafter's agreement, which per-depth acceptance and the bandit's prior learn from."""
        return self.accepted / self.rows if self.rows else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0.0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_batch_size(self) -> float:
        return self.rows / self.rounds if self.rounds else 0.0

    @property
    def goodput(self) -> float:
        """Emitted tokens per second of summed round wall time (0.0 without time)."""
        return self.emitted / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def estimated_speedup(self) -> float | None:
        """Estimated plain-decoding time / actual time over the rounds that carry an estimate (None without any).

        Above 1.0 the rounds ran faster than plain decoding would have; computed over estimated rounds only, so a
        run with a few unestimated rounds still reports a ratio of like with like.
        """
        if self.estimated_rounds == 0 or self.estimated_wall_time_s <= 0.0:
            return None
        return self.plain_time_estimate_s / self.estimated_wall_time_s
