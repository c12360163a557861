"""Where the fastrl servers of one verl job meet at the end of each rollout to merge their co-trained drafters."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from torch import Tensor

from fastrl.cotrain.cotrainer import TrainedDrafter, merge_weights, mergeable

MAX_FAILURES = 100
"""Failures the hub keeps for its report (the most recent ones: a job of many rounds would grow the list forever)."""


@dataclass
class DrafterRelease:
    """A drafter version every server installs: ``state`` holds CPU float32 tensors; ``contributors`` names the
    servers whose co-trained copies were averaged into it."""

    version: int
    state: dict[str, Tensor]
    contributors: list[str]


@dataclass
class _Round:
    offered: dict[str, TrainedDrafter | None] = field(default_factory=dict)
    complete: asyncio.Event = field(default_factory=asyncio.Event)
    release: DrafterRelease | None = None
    merged: bool = False


class DrafterHub:
    """An async Ray actor (one per job, named by the replicas): servers ``join`` when they start and ``mark`` when
    they turn busy or idle (an idle server co-trains only while ``others_busy``); at each ``sleep``
    every server ``exchange``s what it co-trained during rollout ``round_index``. When all joined servers have
    offered (or ``timeout_s`` passed), the copies trained from the current version are averaged, weighted by
    their optimiser steps, into version + 1, which every caller of that round receives (None when nobody trained).
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = float(timeout_s)
        self.members: set[str] = set()
        self.version = 0
        self.failures: list[str] = []  # the most recent MAX_FAILURES
        self.busy: set[str] = set()
        self._rounds: dict[int, _Round] = {}  # the rounds not merged yet, and the last merged one
        self._next_round = 0  # the round the servers' next sleep exchanges (the last merged one + 1)

    def join(self, server: str, drafter_version: int) -> int:
        """Register a server running drafter ``drafter_version``; returns the round index its next ``sleep``
        exchanges (a server added to a running job lines up with the others, not with round 0)."""
        self.members.add(server)
        self.version = max(self.version, int(drafter_version))
        return self._next_round

    def leave(self, server: str) -> int:
        """A server shut down; returns how many members remain (0: the hub's job is over). A round the others
        were waiting on for it completes now."""
        self.members.discard(server)
        self.busy.discard(server)
        for state in self._rounds.values():
            if self.members <= set(state.offered):
                state.complete.set()
        return len(self.members)

    def mark(self, server: str, busy: bool) -> None:
        """A server got its first request in flight (``busy``) or finished its last one."""
        if busy:
            self.busy.add(server)
        else:
            self.busy.discard(server)

    def others_busy(self, server: str) -> bool:
        """True while another server still has requests in flight (the tail that ``server`` may train during)."""
        return bool(self.busy - {server})

    async def exchange(self, server: str, round_index: int, trained: TrainedDrafter | None) -> DrafterRelease | None:
        """Offer this server's co-trained copy for ``round_index``; returns the round's release (or None). A round
        older than the last merged one is over: its late offer is dropped and None returned at once."""
        round_index = int(round_index)
        if round_index < self._next_round - 1:  # the last merged round stays: a late offer there gets its release
            self._fail(f"round {round_index}: {server} offered after a later round merged; its copy is dropped")
            return None
        state = self._rounds.setdefault(round_index, _Round())
        state.offered[server] = trained
        if self.members <= set(state.offered):
            state.complete.set()
        try:
            await asyncio.wait_for(state.complete.wait(), self.timeout_s)
        except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
            missing = sorted(self.members - set(state.offered))
            self._fail(f"round {round_index}: merged without {missing} after {self.timeout_s}s")
        if not state.merged:
            if round_index < self._next_round - 1:  # a later round merged while this one waited: too late
                return None
            state.merged = True
            state.release = self._merge(state.offered)
            state.offered = dict.fromkeys(state.offered)  # merged: the copies' tensors go (who offered stays)
            self._next_round = max(self._next_round, round_index + 1)
            for index in [i for i in self._rounds if i < round_index]:  # over: their releases are superseded
                del self._rounds[index]
        return state.release

    def _fail(self, message: str) -> None:
        """Record a failure, keeping the most recent MAX_FAILURES."""
        self.failures = [*self.failures, message][-MAX_FAILURES:]

    def _merge(self, offered: dict[str, TrainedDrafter | None]) -> DrafterRelease | None:
        kept, failures = mergeable({s: t for s, t in offered.items() if t is not None}, self.version)
        for failure in failures:
            self._fail(failure)
        if not kept:
            return None
        try:
            merged = merge_weights(kept)
        except ValueError as err:
            self._fail(f"merge: {err}")
            return None
        self.version += 1
        return DrafterRelease(self.version, merged, sorted(kept))

    def report(self) -> dict:
        """Version, members, the round the next sleeps exchange and failures (for tests and logs)."""
        return {
            "version": self.version,
            "members": sorted(self.members),
            "next_round": self._next_round,
            "failures": list(self.failures),
        }
