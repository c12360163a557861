"""Where the fastrl servers of one verl job meet at the end of each rollout to merge their co-trained drafters."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from torch import Tensor

from fastrl.cotrain.cotrainer import TrainedDrafter, average_drafters


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
        self.failures: list[str] = []
        self.busy: set[str] = set()
        self._rounds: dict[int, _Round] = {}

    def join(self, server: str, drafter_version: int) -> int:
        """Register a server running drafter ``drafter_version``; returns the hub's current version."""
        self.members.add(server)
        self.version = max(self.version, int(drafter_version))
        return self.version

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
        """Offer this server's co-trained copy for ``round_index``; returns the round's release (or None)."""
        state = self._rounds.setdefault(int(round_index), _Round())
        state.offered[server] = trained
        if self.members <= set(state.offered):
            state.complete.set()
        try:
            await asyncio.wait_for(state.complete.wait(), self.timeout_s)
        except TimeoutError:
            missing = sorted(self.members - set(state.offered))
            self.failures.append(f"round {round_index}: merged without {missing} after {self.timeout_s}s")
        if not state.merged:
            state.merged = True
            state.release = self._merge(state.offered)
        return state.release

    def _merge(self, offered: dict[str, TrainedDrafter | None]) -> DrafterRelease | None:
        usable = {s: t for s, t in offered.items() if t is not None and t.base_version == self.version and t.steps > 0}
        if not usable:
            return None
        try:
            merged = average_drafters([(t.state, float(t.steps)) for t in usable.values()])
        except ValueError as err:
            self.failures.append(f"merge: {err}")
            return None
        self.version += 1
        return DrafterRelease(self.version, merged, sorted(usable))

    def report(self) -> dict:
        """Version, members and failures (for tests and logs)."""
        return {"version": self.version, "members": sorted(self.members), "failures": list(self.failures)}
