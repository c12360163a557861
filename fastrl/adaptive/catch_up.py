"""What pulling an arm now costs beyond its round: its draft sources catching up on the text emitted without them.

A drafter round after rounds without the drafter first feeds it the tokens those rounds emitted, and a history round
first indexes what its groups emitted since their last history draft (``RoundStats.catch_up_time_s``). The bandit
learns an arm's round time without that catch-up (it is the earlier rounds' cost as much as this one's), but an
exploratory pull pays it at once: on task prompts x 8 at batch 64 on this CPU, the first drafter and history pulls
after plain rounds caught up for 24, 9 and 191 ms beside plain rounds of 9 ms, most of the bandit's loss to plain
decoding there. ``CatchUpCosts`` keeps each source's backlog (tokens emitted by rounds without it since its last round,
at most the tokens the rows hold; the drafter's as the engine counts it, ``RoundStats.drafter_backlog``, where a
backlog limit had the drafter read most of a long plain stretch already) and its seconds per backlog token (learned
from the rounds of that source alone: a hybrid round's one catch-up time mixes both), so the predicted catch-up of a
pull is charged to exploration.
"""

from __future__ import annotations

import math

from fastrl.json_values import is_int, is_real
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import Strategy

SOURCES = ("drafter", "history")
"""The draft sources that catch up: the EAGLE drafter and the history index."""


def sources(arm: Strategy) -> tuple[str, ...]:
    """The draft sources a round of ``arm`` runs."""
    return tuple(s for s, used in zip(SOURCES, (arm.uses_drafter, arm.is_history), strict=True) if used)


class CatchUpCosts:
    """Each draft source's backlog and catch-up seconds per backlog token (see the module docstring)."""

    def __init__(self) -> None:
        self.backlog = dict.fromkeys(SOURCES, 0)
        """Tokens emitted by rounds without the source since its last round."""
        self._seconds = dict.fromkeys(SOURCES, 0.0)  # catch-up seconds of the source's lone rounds
        self._tokens = dict.fromkeys(SOURCES, 0)  # the backlogs those rounds caught up on

    def observe(self, stats: RoundStats) -> None:
        """Learn from one round: the rate of its source (a round of one source after a backlog), then the backlogs."""
        used = sources(stats.strategy)
        if len(used) == 1 and self.backlog[used[0]] > 0:
            self._seconds[used[0]] += stats.catch_up_time_s
            self._tokens[used[0]] += self.backlog[used[0]]
        # the rows hold no more than their context: text of requests that finished since needs no catching up
        held = stats.context_tokens + stats.total_emitted if stats.context_tokens else None
        for source in SOURCES:
            backlog = self.backlog[source] + stats.total_emitted
            self.backlog[source] = 0 if source in used else backlog if held is None else min(backlog, held)
        if stats.drafter_backlog is not None:  # the engine's own count: what its backlog limit had read is not due
            self.backlog["drafter"] = stats.drafter_backlog

    def rate(self, source: str) -> float:
        """Catch-up seconds per backlog token of ``source`` (0.0 before a round of it caught up)."""
        return self._seconds[source] / self._tokens[source] if self._tokens[source] else 0.0

    def seconds(self, arm: Strategy) -> float:
        """Predicted catch-up seconds of a round of ``arm`` now."""
        return sum(self.rate(source) * self.backlog[source] for source in sources(arm))

    def state(self) -> dict:
        """Plain data: per source, its backlog, and the seconds and tokens its rate is learned from."""
        return {s: [self.backlog[s], self._seconds[s], self._tokens[s]] for s in SOURCES}

    def load(self, state: dict, backlog: bool = True) -> None:
        """Restore ``state`` (checked by ``check_state``); ``backlog=False`` takes the rates alone (another run's
        text is not this run's backlog)."""
        for source, (tokens, seconds, learned) in check_state(state).items():
            self.backlog[source] = int(tokens) if backlog else 0
            self._seconds[source], self._tokens[source] = float(seconds), int(learned)

    @staticmethod
    def merge_states(states: list[dict]) -> dict:
        """Several workers' states as one: the rates' sums added, the least backlog (no worker's round in flight)."""
        checked = [check_state(s) for s in states]
        return {
            s: [min(c[s][0] for c in checked), sum(c[s][1] for c in checked), sum(c[s][2] for c in checked)]
            for s in SOURCES
        }


def check_state(state: object) -> dict:
    """``state`` when it is a ``CatchUpCosts.state()``; ValueError naming the entry otherwise."""
    if not isinstance(state, dict) or set(state) != set(SOURCES):
        raise ValueError(f"catch_up must hold {list(SOURCES)}, got {state!r}"[:300])
    for source, entry in state.items():
        if not (isinstance(entry, list) and len(entry) == 3):
            raise ValueError(f"catch_up.{source} must be [backlog tokens, seconds, tokens], got {entry!r}"[:300])
        tokens, seconds, learned = entry
        if not (is_int(tokens) and tokens >= 0 and is_int(learned) and learned >= 0):
            raise ValueError(f"catch_up.{source}: the backlog and the tokens learned must be integers >= 0")
        if not (is_real(seconds) and 0 <= seconds < math.inf):
            raise ValueError(f"catch_up.{source}: the seconds must be a finite number >= 0, got {seconds!r}")
    return state
